//! The BareMetalHost power controller's decisions.
//!
//! The controller loop is observe → [`decide`] → act → record:
//!
//! 1. Observe: read the `BareMetalHost` and query the BMC's power state, and build a
//!    [`HostSnapshot`] ([`HostSnapshot::from_host`]).
//! 2. Decide: [`decide`] (or [`decide_with_config`]) returns a [`Decision`]: status updates,
//!    then actions (annotation removals, one power call, events), then when to look again.
//! 3. Record *first*: apply [`Decision::status`] with [`apply_status_updates`] and write the
//!    status with the object's `resourceVersion` as precondition. This is a write-ahead log:
//!    a power request is recorded in `status.lastPowerAction` before it is sent, so after a
//!    crash the next decision knows it may be in flight and does not send it again. If the
//!    write conflicts (the object changed, e.g. an annotation was added or removed since it
//!    was read), drop the decision and reconcile again.
//! 4. Act: carry out [`Decision::actions`] in order; stop at the first failure. After a
//!    power call, feed its result to [`after_power_call`] and record that too.
//!
//! All state lives in the object (annotations + status), so any snapshot, including one
//! taken right after an operator restart, yields the right next step.

mod config;
mod decide;
mod decision;
pub mod lanes;
pub mod observation;
mod snapshot;
mod status;

pub use config::DecideConfig;
pub use decide::{after_power_call, decide, decide_with_config};
pub use decision::{
    Action, AnnotationRemovalReason, ConditionUpdate, Decision, Event, EventType, StatusUpdate,
};
pub use snapshot::{
    BmcFailure, BmcFailureKind, BmcObservation, HostSnapshot, ObservedPower, PowerCallResult,
};
pub use status::apply_status_updates;
