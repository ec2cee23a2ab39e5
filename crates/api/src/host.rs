//! The `BareMetalHost` custom resource (`metal3.io/v1alpha1`).
//!
//! Schema-compatible with metal3's BareMetalHost: we model only the fields the power
//! controller uses. Every other field (metal3's `image`, `rootDeviceHints`,
//! `status.hardware`, ...) is accepted by the CRD (`x-kubernetes-preserve-unknown-fields`)
//! and kept in the `extra` maps, so a read-modify-write by this operator never drops it.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ObjectReference, SecretReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::provisioning::ProvisioningState;

// `extra` holds every spec field we do not model (metal3's `image`, `rootDeviceHints`,
// `hardwareProfile`, ...). kube's structural-schema rewrite turns the flattened map into
// `x-kubernetes-preserve-unknown-fields: true` on `spec`.
/// Desired state of a bare-metal host. Fields not listed here (metal3's `image`,
/// `rootDeviceHints`, ...) are accepted and preserved.
// Several printcolumns share a `type_`, which clippy mistakes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[kube(
    group = "metal3.io",
    version = "v1alpha1",
    kind = "BareMetalHost",
    plural = "baremetalhosts",
    singular = "baremetalhost",
    namespaced,
    // metal3's short names: `kubectl get bmh` and `kubectl get bmhost` both work.
    shortname = "bmh",
    shortname = "bmhost",
    status = "BareMetalHostStatus",
    derive = "PartialEq",
    doc = "BareMetalHost is a physical server whose power is managed through its BMC.",
    // metal3's columns, in metal3's order and priorities (`-o wide` adds Status and BMC), and
    // the power state hostcycle observes (`-o wide`).
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.operationalStatus",
        description = "Operational status",
        priority = "1"
    ),
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.provisioning.state",
        description = "Provisioning status"
    ),
    printcolumn(
        name = "Consumer",
        type_ = "string",
        json_path = ".spec.consumerRef.name",
        description = "Consumer using this host"
    ),
    printcolumn(
        name = "BMC",
        type_ = "string",
        json_path = ".spec.bmc.address",
        description = "Address of management controller",
        priority = "1"
    ),
    printcolumn(
        name = "Online",
        type_ = "string",
        json_path = ".spec.online",
        description = "Whether the host is online or not"
    ),
    printcolumn(
        name = "Error",
        type_ = "string",
        json_path = ".status.errorType",
        description = "Type of the most recent error"
    ),
    printcolumn(
        name = "PoweredOn",
        type_ = "boolean",
        json_path = ".status.poweredOn",
        description = "Power state last observed from the BMC",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time duration since creation of BaremetalHost"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BareMetalHostSpec {
    /// Whether the host should be powered on. Reboot annotations override it temporarily.
    pub online: bool,

    /// How to reach the host's baseboard management controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<BmcDetails>,

    /// MAC address of the NIC the host boots from.
    #[serde(
        default,
        rename = "bootMACAddress",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 128))]
    pub boot_mac_address: Option<String>,

    /// The object (usually a Machine) using this host. Its presence makes the host `provisioned`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = bound_object_reference)]
    pub consumer_ref: Option<ObjectReference>,

    /// The host was provisioned by something other than metal3 (and other than us).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub externally_provisioned: bool,

    /// metal3 `disablePowerOff`: power is never cut. A reboot is a BMC restart (hard:
    /// ForceRestart; soft: GracefulRestart, ForceRestart if the BMC does not offer it), and
    /// `online: false` or a keyed `reboot.metal3.io/{key}` hold is refused (Warning Event and
    /// the `PowerOffRefused` condition).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disable_power_off: bool,

    /// Spec fields this operator does not model, preserved verbatim.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// BMC connection details (metal3 `spec.bmc`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BmcDetails {
    /// BMC URL, e.g. `redfish://10.0.0.5/redfish/v1/Systems/1` or `ipmi://10.0.0.5`.
    #[serde(default)]
    #[schemars(length(max = 2048))]
    pub address: String,
    /// Name of the Secret (same namespace) holding `username` and `password`.
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub credentials_name: String,
    /// Skip TLS verification of the BMC's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_certificate_verification: Option<bool>,
}

/// The longest `spec.bmc.address` hostcycle reads, in bytes (the CRD's `maxLength`).
/// metal3's own CRD sets no limit; URLs longer than this are refused by common HTTP stacks.
pub const MAX_BMC_ADDRESS_LEN: usize = 2048;
/// The longest Kubernetes object name (a DNS-1123 subdomain): `credentialsName`,
/// `consumerRef.name`.
pub const MAX_NAME_LEN: usize = 253;
/// The longest namespace name (a DNS-1123 label): `consumerRef.namespace`.
pub const MAX_NAMESPACE_LEN: usize = 63;

/// `maxLength` of each field of `spec.consumerRef` (an `ObjectReference`), in the CRD: names
/// and namespaces as Kubernetes allows them, an API version as a group (253) and a version
/// (63), a kind as a name; generous limits for the fields hostcycle does not read.
const OBJECT_REFERENCE_MAX_LENGTHS: [(&str, u64); 7] = [
    ("apiVersion", 317),
    ("kind", 253),
    ("name", MAX_NAME_LEN as u64),
    ("namespace", MAX_NAMESPACE_LEN as u64),
    ("uid", 128),
    ("resourceVersion", 256),
    ("fieldPath", 1024),
];

fn bound_object_reference(schema: &mut schemars::Schema) {
    let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    for (field, max) in OBJECT_REFERENCE_MAX_LENGTHS {
        if let Some(property) = properties.get_mut(field).and_then(Value::as_object_mut) {
            property.insert("maxLength".into(), Value::from(max));
        }
    }
}

/// Why hostcycle does not use a host's `spec.bmc`: a value beyond the CRD's limits (a host
/// written before them, or under metal3's own CRD, which has none) or a `credentialsName`
/// that cannot name a Secret. The message names the field and the limit, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BmcSpecRefused {
    #[error(
        "spec.bmc.address is longer than the {MAX_BMC_ADDRESS_LEN} bytes hostcycle reads; \
         use the BMC's URL"
    )]
    AddressTooLong,
    #[error(
        "spec.bmc.credentialsName is not a Secret name (lowercase letters, digits, `-` and \
         `.`, at most {MAX_NAME_LEN} characters); fix it"
    )]
    BadCredentialsName,
}

impl BmcDetails {
    /// Whether hostcycle may read this `spec.bmc` (see [`BmcSpecRefused`]). An empty
    /// `credentialsName` is left to the caller, which names what is missing.
    pub fn check_bounds(&self) -> Result<(), BmcSpecRefused> {
        if self.address.len() > MAX_BMC_ADDRESS_LEN {
            return Err(BmcSpecRefused::AddressTooLong);
        }
        let name = self.credentials_name.trim();
        if !name.is_empty() && !is_object_name(name) {
            return Err(BmcSpecRefused::BadCredentialsName);
        }
        Ok(())
    }
}

/// A DNS-1123 subdomain: what Kubernetes allows as the name of a Secret.
pub fn is_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

// `extra` keeps metal3 status fields we do not use (`hardware`, `hardwareProfile`,
// `operationHistory`, `triedCredentials`, ...).
/// Observed state of a bare-metal host, written by the controller. Fields not listed here
/// (metal3's `hardware`, `operationHistory`, ...) are accepted and preserved.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BareMetalHostStatus {
    /// Power state last observed from the BMC. Always written, as metal3 does (`false` until
    /// the first observation: a metal3 client reads a missing `poweredOn` as `false` anyway);
    /// `None` in memory only for a status that never carried the field. Use
    /// [`BareMetalHostStatus::observed_powered_on`] to tell a real "off" from "never seen".
    #[serde(
        default,
        deserialize_with = "lenient",
        serialize_with = "serialize_powered_on"
    )]
    pub powered_on: Option<bool>,

    /// When the controller last wrote this status (metal3 `status.lastUpdated`); set by every
    /// status write. RFC 3339 with sub-second precision.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_updated: Option<Timestamp>,

    // Status fields read leniently: a value another writer (a newer or older version, metal3)
    // put there that this version does not know reads as absent, and is never a reason for a
    // whole list (and the watch) to fail to decode.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "OperationalStatus::field_schema")]
    pub operational_status: Option<OperationalStatus>,

    /// Kind of the last error; absent when `operationalStatus` is not `error`.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "ErrorType::field_schema")]
    pub error_type: Option<ErrorType>,

    /// Human-readable detail of the last error; empty (and not written) when there is none.
    // Not written when empty: Kubernetes 1.20 decodes "" in custom resources as null.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_message: String,

    /// Consecutive errors; drives the retry backoff. Reset to 0 on recovery.
    #[serde(default, deserialize_with = "lenient_or_default")]
    pub error_count: u32,

    /// The credentials last seen to work against the BMC. metal3 writes `goodCredentials: {}`
    /// before any did (Go never omits a struct): that reads as `None`, so it is never taken
    /// for evidence that the BMC answered.
    #[serde(
        default,
        deserialize_with = "credentials_that_worked",
        skip_serializing_if = "Option::is_none"
    )]
    pub good_credentials: Option<CredentialsStatus>,

    #[serde(default, deserialize_with = "lenient_or_default")]
    pub provisioning: ProvisionStatus,

    /// Standard Kubernetes conditions: `RebootPending`, `BMCHealthy`.
    #[serde(
        default,
        deserialize_with = "lenient_items",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The last power action this controller requested, and what became of it. One this
    /// version cannot read (an unknown trigger or state) reads as absent.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_power_action: Option<LastPowerAction>,

    /// hostcycle's record of the power readings it actually made, and from which BMC: the
    /// only power *evidence* fencing trusts (a status write without a reading never changes
    /// it). Written by hostcycle's host controller alone; metal3's operator never writes it.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub power_observation: Option<PowerObservation>,

    /// Status fields this operator does not model, preserved verbatim.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `value` decoded as `T`, or `None` when it is not a `T` this version knows.
fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let value = Option::<Value>::deserialize(deserializer)?;
    Ok(value.and_then(|v| serde_json::from_value(v).ok()))
}

/// `goodCredentials` when it names a Secret; metal3's empty `{}` is `None`.
fn credentials_that_worked<'de, D>(deserializer: D) -> Result<Option<CredentialsStatus>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(lenient::<D, CredentialsStatus>(deserializer)?.filter(|c| {
        c.credentials
            .as_ref()
            .and_then(|r| r.name.as_deref())
            .is_some_and(|name| !name.is_empty())
    }))
}

/// Like [`lenient`], with the default for a value this version cannot read.
fn lenient_or_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned + Default,
{
    Ok(lenient(deserializer)?.unwrap_or_default())
}

/// The items of a list this version can read; the others are left out.
fn lenient_items<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let value = Option::<Value>::deserialize(deserializer)?;
    Ok(match value {
        Some(Value::Array(items)) => items
            .into_iter()
            .filter_map(|item| serde_json::from_value(item).ok())
            .collect(),
        _ => Vec::new(),
    })
}

/// `poweredOn` is never omitted: `None` (not observed yet) is written as `false`, metal3's zero
/// value.
fn serialize_powered_on<S: serde::Serializer>(
    powered_on: &Option<bool>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_bool(powered_on.unwrap_or(false))
}

impl BareMetalHostStatus {
    /// The power state as last observed, or `None` when it has never been observed.
    ///
    /// `poweredOn: false` is also what a status written before the first observation holds
    /// (the field is never omitted), so `false` counts only with evidence that the BMC has
    /// answered: working credentials, a power action, a recorded power-on, or status `OK`.
    /// `true` is always an observation.
    pub fn observed_powered_on(&self) -> Option<bool> {
        match self.powered_on {
            Some(true) => Some(true),
            Some(false)
                if self.good_credentials.is_some()
                    || self.last_power_action.is_some()
                    || self.provisioning.last_powered_on.is_some()
                    || self.operational_status == Some(OperationalStatus::Ok) =>
            {
                Some(false)
            }
            _ => None,
        }
    }
}

/// metal3 `status.provisioning`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProvisionStatus {
    /// Provisioning state: registering, available, provisioned, externally provisioned,
    /// deprovisioning or unmanaged (other metal3 states are preserved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ProvisioningState>,

    /// Start of the last boot this controller caused: the time the power-on was requested,
    /// recorded only once the BMC confirmed the host on. Every process that was running
    /// before this instant has been stopped. RFC 3339 with sub-second precision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_powered_on: Option<Timestamp>,

    /// The controller's clock when it first noticed the pending reboot request(s); requests
    /// were made at or before this instant. A reboot is pending while this is later than
    /// `lastPoweredOn`. RFC 3339 with sub-second precision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_reboot_since: Option<Timestamp>,

    /// `hard` once any request of the pending reboot asked for a hard reboot: the power-off
    /// that serves it stays hard even if that annotation is removed before the power-off is
    /// sent. Absent means soft; reset whenever a new `pendingRebootSince` is recorded.
    /// hostcycle only (metal3 keeps no such field). Read leniently: an unknown value must not
    /// make the whole `provisioning` (and its timestamps) unreadable.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub pending_reboot_mode: Option<PowerOffMode>,

    /// Fields such as `ID`, `image`, `rootDeviceHints`, `bootMode`, preserved verbatim.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// metal3 `status.goodCredentials`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<SecretReference>,
    /// `resourceVersion` of the Secret that worked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_version: Option<String>,
}

/// metal3 `status.operationalStatus`. All metal3 values are accepted when reading; this
/// controller writes `OK`, `discovered`, `error` and `detached`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
pub enum OperationalStatus {
    /// Power management works.
    #[serde(rename = "OK")]
    Ok,
    /// No BMC address configured: the host is known but cannot be managed.
    #[serde(rename = "discovered")]
    Discovered,
    /// The last BMC interaction failed; see `errorType` / `errorMessage`.
    #[serde(rename = "error")]
    Error,
    /// metal3: provisioning delayed. Never written by this controller.
    #[serde(rename = "delayed")]
    Delayed,
    /// `baremetalhost.metal3.io/detached` is set: power is not managed.
    #[serde(rename = "detached")]
    Detached,
    /// metal3: servicing in progress. Never written by this controller.
    #[serde(rename = "servicing")]
    Servicing,
}

impl OperationalStatus {
    /// Every value, in metal3's order.
    pub const ALL: [Self; 6] = [
        Self::Ok,
        Self::Discovered,
        Self::Error,
        Self::Delayed,
        Self::Detached,
        Self::Servicing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::Discovered => "discovered",
            Self::Error => "error",
            Self::Delayed => "delayed",
            Self::Detached => "detached",
            Self::Servicing => "servicing",
        }
    }
}

/// metal3 `status.errorType`. All metal3 values are accepted when reading; this controller
/// writes only `registration error`, `provisioned registration error` (credentials rejected)
/// and `power management error` (BMC unreachable, power call failed or timed out).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
pub enum ErrorType {
    /// Credentials rejected on a host that is provisioned or externally provisioned.
    #[serde(rename = "provisioned registration error")]
    ProvisionedRegistrationError,
    /// Credentials rejected (or missing) on a host that is not provisioned.
    #[serde(rename = "registration error")]
    RegistrationError,
    /// metal3: inspection failed. Never written by this controller.
    #[serde(rename = "inspection error")]
    InspectionError,
    /// metal3: preparation failed. Never written by this controller.
    #[serde(rename = "preparation error")]
    PreparationError,
    /// metal3: provisioning failed. Never written by this controller.
    #[serde(rename = "provisioning error")]
    ProvisioningError,
    /// BMC unreachable, a power call failed, or a requested power change was never observed.
    #[serde(rename = "power management error")]
    PowerManagementError,
    /// metal3: detaching failed. Never written by this controller.
    #[serde(rename = "detach error")]
    DetachError,
    /// metal3: servicing failed. Never written by this controller.
    #[serde(rename = "servicing error")]
    ServicingError,
}

impl ErrorType {
    /// Every value, in metal3's order.
    pub const ALL: [Self; 8] = [
        Self::ProvisionedRegistrationError,
        Self::RegistrationError,
        Self::InspectionError,
        Self::PreparationError,
        Self::ProvisioningError,
        Self::PowerManagementError,
        Self::DetachError,
        Self::ServicingError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ProvisionedRegistrationError => "provisioned registration error",
            Self::RegistrationError => "registration error",
            Self::InspectionError => "inspection error",
            Self::PreparationError => "preparation error",
            Self::ProvisioningError => "provisioning error",
            Self::PowerManagementError => "power management error",
            Self::DetachError => "detach error",
            Self::ServicingError => "servicing error",
        }
    }
}

// metal3 writes `operationalStatus: ""` on a host it has not registered yet (the field is
// never omitted), and a client may write `errorType: ""`: the schema admits the empty string
// besides every known value, so such a status is never refused. Read, "" is "not known".
// (Written by hand: schemars would list `null` among the values of an optional enum.)
fn status_enum_schema(
    description: &str,
    values: impl Iterator<Item = &'static str>,
) -> schemars::Schema {
    let values: Vec<&str> = std::iter::once("").chain(values).collect();
    schemars::json_schema!({
        "description": description,
        "type": "string",
        "nullable": true,
        "enum": values,
    })
}

impl OperationalStatus {
    /// The schema of `status.operationalStatus`.
    fn field_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        status_enum_schema(
            "metal3 `status.operationalStatus`: \"\" (not known yet), OK, discovered, error, delayed, detached or servicing.",
            Self::ALL.iter().map(|s| s.as_str()),
        )
    }
}

impl ErrorType {
    /// The schema of `status.errorType`.
    fn field_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        status_enum_schema(
            "metal3 `status.errorType`: the kind of the last error; absent or \"\" when there is none.",
            Self::ALL.iter().map(|e| e.as_str()),
        )
    }
}

/// How to power a host off. Also the mode of a reboot request.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PowerOffMode {
    /// ACPI shutdown first; the BMC layer falls back to hard if the host does not go off in time.
    #[default]
    Soft,
    /// Immediate power cut.
    Hard,
}

impl PowerOffMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Soft => "soft",
            Self::Hard => "hard",
        }
    }
}

/// The power state a power action drives the host to.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PowerTarget {
    On,
    Off,
}

impl PowerTarget {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::Off => "off",
        }
    }

    /// `true` for [`PowerTarget::On`].
    pub fn is_on(self) -> bool {
        self == Self::On
    }

    pub fn from_powered_on(powered_on: bool) -> Self {
        if powered_on { Self::On } else { Self::Off }
    }
}

/// Why the controller requested a power action.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
pub enum PowerActionTrigger {
    /// A `reboot.metal3.io` annotation asked for a power cycle / hold.
    RebootRequested,
    /// `spec.online: true` (including power-on at the end of a reboot).
    SpecOnline,
    /// `spec.online: false`.
    SpecOffline,
    /// The host is deprovisioning: it is powered off (as metal3 does) before it is
    /// `available`.
    Deprovisioning,
}

/// Lifecycle of a requested power action.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
pub enum PowerActionState {
    /// Sent (or about to be sent) to the BMC; the target state has not been observed yet.
    Requested,
    /// The BMC reported the target state.
    Completed,
    /// The BMC call returned an error; retried after the error backoff.
    Failed,
}

/// The last power action requested by the controller (`status.lastPowerAction`).
///
/// Written *before* the BMC call (write-ahead), so after a crash the controller knows an
/// action may be in flight and does not send it twice.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastPowerAction {
    /// `on` or `off`.
    pub action: PowerTarget,
    /// For `off`: `soft` (with the BMC layer's soft→hard fallback) or `hard`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<PowerOffMode>,
    pub trigger: PowerActionTrigger,
    pub state: PowerActionState,
    /// First request of this action (kept across timed-out retries of the same action).
    pub requested_at: Timestamp,
    /// Most recent request sent to the BMC; in-flight timeouts count from here.
    pub last_attempt_at: Timestamp,
    /// How many times the action was sent (1 for the first request).
    #[serde(default)]
    pub attempts: u32,
    /// When the BMC was first seen in the target state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Timestamp>,
    /// Set when a soft power-off became a hard one, with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_fallback: Option<HardFallback>,
    /// Error returned by the BMC call, for `state: Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// `spec.disablePowerOff`: this `on` action is a BMC restart serving a reboot (`mode` is
    /// the restart's). It completes when the BMC accepts it, not when the host is seen on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restart: bool,
}

impl LastPowerAction {
    /// Requested and not yet observed, regardless of any timeout.
    pub fn is_requested(&self) -> bool {
        self.state == PowerActionState::Requested
    }
}

/// A run of agreeing BMC power readings (`status.powerObservation`), as hostcycle's host
/// controller made them: the state, the BMC that answered, when the run's first reading was
/// made and when a later one (at least [`PowerObservation::CONFIRM_GAP`] after it) agreed.
///
/// The run restarts (`readings: 0`) when a power request is recorded or a new reboot request is
/// noticed, and on every failed read, change of state or change of BMC: so "two readings" are
/// always consecutive, and always made after the request that caused them. Identical readings
/// after the second are not written (a steady host costs no status write).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PowerObservation {
    /// What the readings of this run say: `On`, `Off`, `Transitioning` or `Unknown` (a run of
    /// no reading yet keeps the last state read).
    pub state: ObservedPowerState,
    /// The BMC that answered.
    pub bmc: ObservedBmc,
    /// Agreeing readings in this run: 0 (restarted, none yet), 1 or 2 (confirmed; not counted
    /// further).
    #[serde(default)]
    pub readings: u32,
    /// The first reading of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// The reading that confirmed the first (at least a second later, none failed between).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed_at: Option<Timestamp>,
}

impl PowerObservation {
    /// The least time between the two readings of a confirmed run.
    pub const CONFIRM_GAP: std::time::Duration = std::time::Duration::from_secs(1);

    /// Two agreeing readings at least [`Self::CONFIRM_GAP`] apart.
    pub fn confirmed(&self) -> bool {
        self.readings >= 2
            && match (self.since, self.confirmed_at) {
                (Some(since), Some(at)) => {
                    at.duration_since(since).unsigned_abs() >= Self::CONFIRM_GAP && at > since
                }
                _ => false,
            }
    }
}

/// A power state as a BMC reported it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
pub enum ObservedPowerState {
    On,
    Off,
    /// Redfish `PoweringOn`/`PoweringOff`: not off.
    Transitioning,
    /// The BMC answered without a state this controller understands.
    Unknown,
}

impl ObservedBmc {
    /// Whether `other` reaches the same machine: the same address, and the same identity where
    /// both report one — else the same Secret, as nothing else tells.
    pub fn same_machine(&self, other: &ObservedBmc) -> bool {
        self.address == other.address
            && match (&self.identity, &other.identity) {
                (Some(a), Some(b)) => a == b,
                _ => self.credentials_name == other.credentials_name,
            }
    }

    /// The BMC `spec.bmc` names now (address and Secret; no identity: only a reading tells).
    pub fn of_spec(spec: &BareMetalHostSpec) -> ObservedBmc {
        let bmc = spec.bmc.as_ref();
        ObservedBmc {
            address: bmc.map(|b| b.address.clone()).unwrap_or_default(),
            credentials_name: bmc.map(|b| b.credentials_name.clone()).unwrap_or_default(),
            identity: None,
        }
    }
}

/// Which BMC a reading came from: the address and Secret it was read with, and what the BMC
/// says it is (Redfish: `uuid:<System UUID>`, else `serial:<SerialNumber>`; IPMI: `guid:<System GUID>`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedBmc {
    /// `spec.bmc.address` as read with.
    pub address: String,
    /// `spec.bmc.credentialsName` as read with.
    #[serde(default)]
    pub credentials_name: String,
    /// The BMC's own identity, when it reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
}

/// A soft power-off that was turned into a hard one.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HardFallback {
    /// Who switched to hard: the BMC layer (soft-off timeout) or the controller (escalation).
    pub by: HardFallbackSource,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Timestamp>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
pub enum HardFallbackSource {
    /// The BMC layer's soft→hard fallback fired (the host ignored the ACPI shutdown).
    Bmc,
    /// A hard reboot request arrived while a soft power-off was in flight.
    Escalation,
    /// The host was still on when the soft power-off timeout ran out.
    SoftTimeout,
}

impl BareMetalHostSpec {
    /// metal3 `spec.image.url` when set and non-empty (the image field is not modelled and is
    /// read from the preserved fields).
    pub fn image_url(&self) -> Option<&str> {
        image_url(self.extra.get("image"))
    }
}

impl ProvisionStatus {
    /// metal3 `status.provisioning.image.url` when set and non-empty: the image the host was
    /// provisioned with.
    pub fn image_url(&self) -> Option<&str> {
        image_url(self.extra.get("image"))
    }
}

fn image_url(image: Option<&Value>) -> Option<&str> {
    image
        .and_then(|i| i.get("url"))
        .and_then(Value::as_str)
        .filter(|u| !u.trim().is_empty())
}

impl BareMetalHost {
    /// An online host running an OS we did not provision (`externallyProvisioned: true`),
    /// powered through `bmc_address` with the credentials in Secret `credentials_name`.
    pub fn externally_provisioned(
        name: &str,
        bmc_address: &str,
        credentials_name: &str,
    ) -> BareMetalHost {
        BareMetalHost::new(
            name,
            BareMetalHostSpec {
                online: true,
                externally_provisioned: true,
                bmc: Some(BmcDetails {
                    address: bmc_address.to_string(),
                    credentials_name: credentials_name.to_string(),
                    disable_certificate_verification: None,
                }),
                boot_mac_address: None,
                consumer_ref: None,
                disable_power_off: false,
                extra: BTreeMap::new(),
            },
        )
    }

    /// The annotations map, empty when there are none.
    pub fn annotations_or_empty(&self) -> &BTreeMap<String, String> {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        self.metadata.annotations.as_ref().unwrap_or(&EMPTY)
    }
}

#[cfg(test)]
mod lenient_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    /// Values a newer (or older) writer may put in status never fail the decode of the host,
    /// nor of a list holding it.
    #[test]
    fn unknown_status_values_read_as_absent() {
        let host = json!({
            "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": { "name": "h", "namespace": "ns" },
            "spec": { "online": true },
            "status": {
                "poweredOn": true,
                "operationalStatus": "quarantined",
                "errorType": "firmware update error",
                "errorCount": -3,
                "provisioning": {
                    "state": "externally provisioned", "ID": "x",
                    "lastPoweredOn": "2025-01-01T00:00:00Z", "pendingRebootMode": "gentle"
                },
                "conditions": [
                    { "type": "BMCHealthy", "status": "True", "reason": "Ok", "message": "",
                      "lastTransitionTime": "2025-01-01T00:00:00Z" },
                    { "type": "Broken" }
                ],
                "lastPowerAction": {
                    "action": "cycle", "trigger": "Firmware", "state": "Queued",
                    "requestedAt": "2025-01-01T00:00:00Z", "lastAttemptAt": "2025-01-01T00:00:00Z"
                },
                "hardwareProfile": "unknown"
            }
        });
        let parsed: BareMetalHost = serde_json::from_value(host.clone()).unwrap();
        let status = parsed.status.unwrap();
        assert_eq!(status.powered_on, Some(true));
        assert_eq!(status.operational_status, None);
        assert_eq!(status.error_type, None);
        assert_eq!(status.error_count, 0);
        assert_eq!(status.last_power_action, None);
        assert_eq!(status.provisioning.pending_reboot_mode, None);
        assert!(
            status.provisioning.last_powered_on.is_some(),
            "an unknown pendingRebootMode keeps the rest of provisioning readable"
        );
        assert_eq!(
            status.conditions.len(),
            1,
            "the undecodable condition is left out"
        );
        assert_eq!(status.extra["hardwareProfile"], "unknown");
        assert_eq!(
            status.provisioning.state,
            Some(crate::provisioning::ProvisioningState::ExternallyProvisioned)
        );

        let list = json!({
            "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHostList",
            "metadata": { "resourceVersion": "1" },
            "items": [host, { "metadata": { "name": "plain" }, "spec": { "online": false } }]
        });
        let list: kube::core::ObjectList<BareMetalHost> = serde_json::from_value(list).unwrap();
        assert_eq!(list.items.len(), 2);

        // Known values still read as before.
        let known: BareMetalHostStatus = serde_json::from_value(
            json!({ "operationalStatus": "OK", "errorType": "power management error" }),
        )
        .unwrap();
        assert_eq!(known.operational_status, Some(OperationalStatus::Ok));
        assert_eq!(known.error_type, Some(ErrorType::PowerManagementError));
    }
}

#[cfg(test)]
mod same_machine_tests {
    use super::ObservedBmc;

    fn bmc(address: &str, secret: &str, identity: Option<&str>) -> ObservedBmc {
        ObservedBmc {
            address: address.into(),
            credentials_name: secret.into(),
            identity: identity.map(str::to_string),
        }
    }

    #[test]
    fn the_same_machine_is_the_same_address_and_identity_or_else_secret() {
        let a = bmc("redfish://10.0.0.1", "s1", Some("uuid:a"));
        assert!(a.same_machine(&a));
        assert!(a.same_machine(&bmc("redfish://10.0.0.1", "s2", Some("uuid:a"))));
        assert!(!a.same_machine(&bmc("redfish://10.0.0.1", "s1", Some("uuid:b"))));
        assert!(!a.same_machine(&bmc("redfish://10.0.0.2", "s1", Some("uuid:a"))));
        // Without an identity on either side, only the Secret can tell.
        assert!(a.same_machine(&bmc("redfish://10.0.0.1", "s1", None)));
        assert!(!a.same_machine(&bmc("redfish://10.0.0.1", "s2", None)));
    }
}
