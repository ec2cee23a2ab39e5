//! hostcycle-webhook: the optional validating admission webhook for BareMetalHosts
//! (`hostcycle webhook`, docs/webhook.md).
//!
//! - [`values`] and [`decide`]: the decision, pure — reboot annotation values the controller
//!   and metal3 both accept, and (with an allow-list) who may request power changes, change
//!   a host's BMC or pause or detach it;
//! - [`review`]: the `AdmissionReview` wire format (v1 and v1beta1), read typed and bounded;
//! - [`server`]: HTTPS with rustls (ring), certificate files reloaded when they change,
//!   limits that keep it answering under abuse, and a probe port of its own;
//! - [`manifests`]: the optional install objects (ValidatingWebhookConfiguration, Service,
//!   Deployment, PodDisruptionBudget, NetworkPolicy) and [`manifests::register`], which
//!   applies a configuration with the admissionregistration version the API server serves;
//! - [`cli`]: `hostcycle webhook`.

pub mod cli;
pub mod decide;
pub mod manifests;
pub mod metrics;
pub mod policy;
pub mod review;
pub mod server;
pub mod values;

pub use decide::{Outcome, PowerChange, Verdict, decide, power_changes};
pub use policy::{AllowList, Policy, ServiceAccountName, operator_service_account};
pub use values::{ACCEPTED_VALUES, ValueProblem, check_reboot_value};

/// The path the API server posts BareMetalHost reviews to.
pub const VALIDATE_PATH: &str = "/validate-baremetalhost";
