//! The reboot queue's decisions (CKE's rules, made event-driven).
//!
//! The controller loop is observe → decide → act → record, like the BareMetalHost
//! controller's, with the rules split by concern:
//!
//! - [`plan`]: the whole queue at once — which entries start draining now, which leave the
//!   queue (cancelled, node missing, duplicate), why every other entry waits, which drains
//!   stop because the queue is disabled, and which nodes the queue cordoned but no longer
//!   needs. `hostcycle reboot-queue plan` calls the same function on a snapshot.
//! - [`drain`]: one node's drain — which pods are evicted, deleted, skipped or block it, what
//!   an eviction's answer means, when the drain is done or timed out, how long it backs off.
//! - [`reboot`]: one node's reboot — when to request it, what proves the node booted.
//! - [`entry`]: one entry's next step as a decision the controller carries out — the status
//!   change to record first, the actions after it, the Events — for every step of the
//!   entry's life (start and follow a drain, back off, start and follow a reboot, a boot
//!   timeout, a worker's report, waiting, leaving).
//! - [`host`]: how a Node finds its BareMetalHost.
//! - [`address`]: which node addresses the reboot and boot-check commands may get.
//! - [`commands`]: the operator's command sets, which `Command` runs (never the
//!   RebootQueue's).
//! - [`away`]: which nodes known to exist are away (no Node object, fenced, held off): the
//!   gate counts them.
//!
//! Nothing here does I/O; the controller feeds snapshots in and carries the results out.

pub mod address;
pub mod away;
pub mod commands;
mod config;
pub mod drain;
pub mod entry;
pub mod host;
mod plan;
pub mod reboot;
mod snapshot;

pub use config::{BackoffConfig, QueueConfig, RebootConfig};
pub use plan::{
    AwayRef, Blocked, Dequeue, DequeueReason, Plan, WaitReason, Waiting, plan, resolve_method,
};
pub use snapshot::{
    AwayNode, CAPI_CONTROL_PLANE_MACHINE_LABEL, CONTROL_PLANE_LABEL, EntryRef, EntryView,
    MASTER_LABEL, QueueNodeView, QueueSnapshot, RebootTarget, api_server_label, api_server_labels,
    machine_api_server,
};
