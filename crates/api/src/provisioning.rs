//! Provisioning states.
//!
//! hostcycle does not write images to disks; the provisioning state only tells whether a
//! host is in use (`provisioned` / `externally provisioned`) and therefore whether the
//! reboot API applies to it. The strings are metal3's, so `kubectl get bmh` reads the same.
//!
//! | state | when |
//! | --- | --- |
//! | `externally provisioned` | `spec.externallyProvisioned: true` |
//! | `provisioned` | `spec.consumerRef` is set, unless `spec.image` was removed (below) |
//! | `deprovisioning` | was (externally) provisioned and no longer is — `consumerRef` cleared, or `spec.image` removed from a host provisioned with an image (`status.provisioning.image` set), as CAPM3 does when it deletes a Metal3Machine; stays while `reboot.metal3.io` annotations remain (the controller removes them) |
//! | `unmanaged` | no `spec.bmc.address`: power cannot be managed |
//! | `registering` | BMC configured, but its credentials have never been seen to work |
//! | `available` | registered, not in use |
//!
//! Any other metal3 state read from an existing object is kept as [`ProvisioningState::Other`]
//! and treated like `available` once the host is registered.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// metal3 `status.provisioning.state`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProvisioningState {
    /// `unmanaged`: no BMC address.
    Unmanaged,
    /// `registering`: BMC credentials not yet seen to work.
    Registering,
    /// `available`: registered, no consumer.
    Available,
    /// `provisioned`: has a `consumerRef`.
    Provisioned,
    /// `externally provisioned`: `externallyProvisioned: true`.
    ExternallyProvisioned,
    /// `deprovisioning`: left a provisioned state; reboot annotations are being cleared.
    Deprovisioning,
    /// Any other metal3 state (`inspecting`, `ready`, `""`, ...), kept verbatim.
    Other(String),
}

impl ProvisioningState {
    pub fn as_str(&self) -> &str {
        match self {
            Self::Unmanaged => "unmanaged",
            Self::Registering => "registering",
            Self::Available => "available",
            Self::Provisioned => "provisioned",
            Self::ExternallyProvisioned => "externally provisioned",
            Self::Deprovisioning => "deprovisioning",
            Self::Other(s) => s,
        }
    }

    pub fn parse(s: &str) -> Self {
        match s {
            "unmanaged" => Self::Unmanaged,
            "registering" => Self::Registering,
            "available" => Self::Available,
            "provisioned" => Self::Provisioned,
            "externally provisioned" => Self::ExternallyProvisioned,
            "deprovisioning" => Self::Deprovisioning,
            other => Self::Other(other.to_owned()),
        }
    }

    /// `provisioned` or `externally provisioned`: the host is in use.
    pub fn is_provisioned(&self) -> bool {
        matches!(self, Self::Provisioned | Self::ExternallyProvisioned)
    }
}

impl fmt::Display for ProvisioningState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ProvisioningState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ProvisioningState {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = Cow::<str>::deserialize(deserializer)?;
        Ok(Self::parse(&s))
    }
}

impl JsonSchema for ProvisioningState {
    fn schema_name() -> Cow<'static, str> {
        "ProvisioningState".into()
    }

    fn inline_schema() -> bool {
        true
    }

    // A free string (no enum): metal3 objects may carry states we do not produce.
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "Provisioning state (metal3 strings): registering, available, provisioned, externally provisioned, deprovisioning, unmanaged."
        })
    }
}

/// Everything the provisioning state is derived from.
#[derive(Debug, Clone, Copy)]
pub struct ProvisioningInputs<'a> {
    pub externally_provisioned: bool,
    pub has_consumer: bool,
    /// `spec.bmc.address` is non-empty.
    pub bmc_configured: bool,
    /// The BMC credentials have been seen to work (now or before).
    pub registered: bool,
    /// The host was provisioned with an image (`status.provisioning.image.url`) and
    /// `spec.image` is now absent or empty: metal3 deprovisions it, even while `consumerRef`
    /// is still set (CAPM3 clears `consumerRef` only after the state left `provisioned`).
    pub image_removed: bool,
    /// Any `reboot.metal3.io` annotation is present.
    pub reboot_annotations_present: bool,
    /// The host controller's readings confirm the host off (`status.powerObservation`: two
    /// `Off` readings a second apart), or it may never be powered off (`disablePowerOff`).
    pub confirmed_off: bool,
    /// `status.provisioning.state` as last recorded.
    pub previous: Option<&'a ProvisioningState>,
}

/// Derives the provisioning state from the spec and the previously recorded state.
///
/// Leaving `provisioned` / `externally provisioned` goes through `deprovisioning`, which
/// lasts until no reboot annotation remains and the host is confirmed off by readings (a
/// host reported available while its machine still runs could be handed to a new consumer),
/// then `available`.
pub fn derive_provisioning_state(inputs: ProvisioningInputs<'_>) -> ProvisioningState {
    if inputs.externally_provisioned {
        return ProvisioningState::ExternallyProvisioned;
    }
    if inputs.has_consumer && !inputs.image_removed {
        return ProvisioningState::Provisioned;
    }
    match inputs.previous {
        Some(previous) if previous.is_provisioned() => return ProvisioningState::Deprovisioning,
        Some(ProvisioningState::Deprovisioning)
            if inputs.reboot_annotations_present
                || (inputs.bmc_configured && !inputs.confirmed_off) =>
        {
            return ProvisioningState::Deprovisioning;
        }
        _ => {}
    }
    if !inputs.bmc_configured {
        ProvisioningState::Unmanaged
    } else if !inputs.registered {
        ProvisioningState::Registering
    } else {
        ProvisioningState::Available
    }
}
