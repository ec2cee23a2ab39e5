//! Machine remediation's decisions: the seed's flow (power off, release the Node only once
//! the host is off, power on, wait for the Node to rejoin) as a pure step function, the place
//! its record lives for each trigger, slot allocation (`maxConcurrentRemediations`), and how
//! a failed remediation escalates to the Machine's owner.

pub mod contracts;
pub mod decide;
pub mod escalation;
pub mod joins;
pub mod orphans;
pub mod record;
pub mod release;

pub use decide::{
    Acting, Action, Blocker, Decision, Escalation, Event, Observation, RemediationHostView,
    RemediationNodeView, RequestNamespaces, Trigger, Workloads, acting_host, decide, left_off,
    needs_workloads, off_confirmed, resolve_release, start_blocker, system_taint, wants_slot,
};
pub use record::Record;
