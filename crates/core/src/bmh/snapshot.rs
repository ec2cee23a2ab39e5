use hostcycle_api::{
    BareMetalHost, BareMetalHostStatus, CredentialsStatus, ObservedBmc, RebootRequests,
    is_detached, is_paused,
};

/// Power state as reported by the BMC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObservedPower {
    On,
    Off,
    /// Powering on or off.
    Transitioning,
    /// The BMC answered but did not say.
    Unknown,
}

impl ObservedPower {
    /// `Some(true)` for on, `Some(false)` for off, `None` when not settled.
    pub fn as_bool(self) -> Option<bool> {
        match self {
            Self::On => Some(true),
            Self::Off => Some(false),
            Self::Transitioning | Self::Unknown => None,
        }
    }
}

/// What kind of BMC failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BmcFailureKind {
    /// Credentials missing or rejected (Secret absent, HTTP 401, IPMI auth failure).
    Credentials,
    /// BMC not reachable (connection refused, timeout, TLS failure).
    Unreachable,
    /// Anything else the BMC layer reported (unsupported, permission denied, bad response).
    Other,
}

/// A failed BMC interaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BmcFailure {
    pub kind: BmcFailureKind,
    pub message: String,
}

/// The result of querying the BMC for this reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BmcObservation {
    Power(ObservedPower),
    Failed(BmcFailure),
    /// The BMC was not queried (paused, detached or no BMC address): no power decision.
    NotQueried,
}

/// The result of a power call the controller made, for [`crate::bmh::after_power_call`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerCallResult {
    /// The BMC accepted the request. `hard_fallback` is set when the BMC layer turned a soft
    /// power-off into a hard one, with its reason.
    Accepted {
        hard_fallback: Option<String>,
    },
    Failed(BmcFailure),
}

/// Everything [`crate::bmh::decide`] looks at: the host object as read, and the BMC as seen.
#[derive(Debug, Clone, PartialEq)]
pub struct HostSnapshot {
    /// `metadata.generation`, stamped on conditions as `observedGeneration`.
    pub generation: Option<i64>,
    /// `spec.online`.
    pub online: bool,
    /// `spec.externallyProvisioned`.
    pub externally_provisioned: bool,
    /// `spec.consumerRef` is set.
    pub has_consumer: bool,
    /// `spec.bmc.address` is non-empty.
    pub bmc_configured: bool,
    /// `spec.disablePowerOff`.
    pub disable_power_off: bool,
    /// `spec.image` when its `url` is set (kept verbatim, recorded as
    /// `status.provisioning.image` once the host is provisioned).
    pub image: Option<serde_json::Value>,
    /// `baremetalhost.metal3.io/paused` present.
    pub paused: bool,
    /// `baremetalhost.metal3.io/detached` present.
    pub detached: bool,
    /// The reboot queue is rebooting the host with its reboot command
    /// (`hostcycle.io/reboot-queue-command`): a host found off is left to the command.
    pub command_reboot: bool,
    /// Every `reboot.metal3.io` annotation, parsed.
    pub reboot_requests: RebootRequests,
    /// Status as recorded on the object (timestamps, last power action, errors...).
    pub status: BareMetalHostStatus,
    /// The BMC's answer this time.
    pub bmc: BmcObservation,
    /// The credentials Secret the BMC was queried with (name, namespace, resourceVersion),
    /// when the operator knows it; recorded as `goodCredentials` once they work.
    pub credentials: Option<CredentialsStatus>,
    /// The BMC this reconcile read: `spec.bmc`'s address and Secret, and the identity the BMC
    /// reported with its reading ([`HostSnapshot::with_bmc_identity`]).
    pub read_with: ObservedBmc,
}

impl HostSnapshot {
    /// Builds the snapshot from the object and this reconcile's BMC observation.
    pub fn from_host(
        host: &BareMetalHost,
        bmc: BmcObservation,
        credentials: Option<CredentialsStatus>,
    ) -> Self {
        let annotations = host.annotations_or_empty();
        Self {
            generation: host.metadata.generation,
            online: host.spec.online,
            externally_provisioned: host.spec.externally_provisioned,
            has_consumer: host.spec.consumer_ref.is_some(),
            bmc_configured: host
                .spec
                .bmc
                .as_ref()
                .is_some_and(|b| !b.address.trim().is_empty()),
            disable_power_off: host.spec.disable_power_off,
            image: host
                .spec
                .image_url()
                .and_then(|_| host.spec.extra.get("image").cloned()),
            paused: is_paused(annotations),
            detached: is_detached(annotations),
            command_reboot: annotations
                .contains_key(hostcycle_api::queue::COMMAND_MARKER_ANNOTATION),
            reboot_requests: RebootRequests::from_annotations(annotations),
            status: host.status.clone().unwrap_or_default(),
            bmc,
            credentials,
            read_with: ObservedBmc::of_spec(&host.spec),
        }
    }

    /// The snapshot with the identity the BMC reported along with this reconcile's reading.
    pub fn with_bmc_identity(mut self, identity: Option<String>) -> Self {
        self.read_with.identity = identity;
        self
    }
}
