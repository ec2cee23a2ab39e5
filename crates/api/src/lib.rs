//! hostcycle-api: the `BareMetalHost` custom resource (metal3-compatible), reboot
//! annotations and their parser, provisioning states, the reboot queue's resources
//! (`RebootQueue`, `RebootQueueEntry`), the `HostHealthCheck` detector, and condition/event
//! reasons.
//!
//! Pure data types and functions: no I/O.

pub mod annotations;
pub mod crd;
pub mod health;
pub mod host;
pub mod provisioning;
pub mod queue;
pub mod reasons;
pub mod remediation;

pub use annotations::{
    DETACHED_ANNOTATION, InvalidRebootValue, MAX_ECHOED_MODE, PAUSED_ANNOTATION, ParsedRebootValue,
    REBOOT_ANNOTATION, REBOOT_ANNOTATION_PREFIX, RebootAnnotationKind, RebootRequest,
    RebootRequests, classify_reboot_annotation, is_detached, is_paused, parse_reboot_value,
};
pub use crd::{CrdError, crd, crd_yaml, crds, crds_yaml};
pub use host::{
    BareMetalHost, BareMetalHostSpec, BareMetalHostStatus, BmcDetails, CredentialsStatus,
    ErrorType, HardFallback, HardFallbackSource, LastPowerAction, ObservedBmc, ObservedPowerState,
    OperationalStatus, PowerActionState, PowerActionTrigger, PowerObservation, PowerOffMode,
    PowerTarget, ProvisionStatus,
};
pub use provisioning::{ProvisioningInputs, ProvisioningState, derive_provisioning_state};
