//! The BareMetalHost power controller: the only writer of host power. Its loop
//! ([`controller`]), the fair lanes its reconciles wait in ([`lanes`]), how it reads a host's
//! BMC and credentials ([`observe`]) and the per-host metrics it keeps ([`host_metrics`]).

pub mod controller;
pub mod host_metrics;
pub mod lanes;
pub mod observe;

pub use controller::{
    BmhControllerConfig, Context, CredentialsPolicy, ReconcileError, run, wants_action,
};
