//! How fresh the evidence is that a host is off (or on).
//!
//! A [`PowerReport`] is a power state and the time it stands for. Which fields feed it is the
//! caller's choice, and decides what the evidence is worth:
//! - **remediation** (releasing a Node's workloads) feeds it only hostcycle's own record of BMC
//!   readings, `status.powerObservation` ([`crate::bmh::observation`]): the state of a run of
//!   two agreeing readings at least a second apart, and the time of the run's first reading.
//!   The run restarts with every request the host controller notices, so "written after the
//!   request" means "both readings made after it". `status.poweredOn` is never used there: any
//!   status write carries it over (a detach, a pause, metal3's operator);
//! - the reboot queue still feeds it `status.poweredOn` and `status.lastUpdated` (its completion
//!   also waits for the Node's boot).
//!
//! metal3 writes `lastUpdated` with whole seconds (`metav1.Time`): a stamp without a fraction
//! stands for any moment of its second, so it counts only from the first whole second after the
//! request. The request time and the stamp come from the clocks of the two controllers (the
//! same process for hostcycle's own); they must agree to well within a second, as NTP keeps
//! them.

use jiff::Timestamp;

/// A host's power as its status reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PowerReport {
    /// `status.poweredOn`, when it is an observation.
    pub powered_on: Option<bool>,
    /// `status.lastUpdated`.
    pub last_updated: Option<Timestamp>,
    /// The host controller's error (`operationalStatus: error`), if any.
    pub error: Option<String>,
}

/// What a status says about the power after some moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerEvidence {
    /// Off, in a status written after the moment, without error.
    Off,
    /// On, in a status written after the moment, without error.
    On,
    /// The last status was written at or before the moment (or never): it says nothing.
    Stale { written_at: Option<Timestamp> },
    /// The host controller reports an error: its power state may be old.
    InError(String),
    /// Written after the moment, but without a power state.
    Unknown,
}

impl PowerEvidence {
    /// Why this is not proof of "off", in words (for waiting messages).
    pub fn describe(&self, since: Timestamp) -> String {
        match self {
            PowerEvidence::Off => "off".into(),
            PowerEvidence::On => "still on".into(),
            PowerEvidence::Stale {
                written_at: Some(at),
            } => format!(
                "its status was last written at {at}, before the power-off request at {since}"
            ),
            PowerEvidence::Stale { written_at: None } => {
                "its status carries no lastUpdated time".into()
            }
            PowerEvidence::InError(e) => format!("the host controller reports: {e}"),
            PowerEvidence::Unknown => "its power state is unknown".into(),
        }
    }
}

/// What `report` proves about the power after `since` (a request's recorded time).
pub fn power_since(report: &PowerReport, since: Timestamp) -> PowerEvidence {
    if let Some(e) = &report.error {
        return PowerEvidence::InError(e.clone());
    }
    match report.last_updated {
        Some(at) if written_after(at, since) => match report.powered_on {
            Some(false) => PowerEvidence::Off,
            Some(true) => PowerEvidence::On,
            None => PowerEvidence::Unknown,
        },
        written_at => PowerEvidence::Stale { written_at },
    }
}

/// Whether a status stamped `at` was certainly written after `since`.
fn written_after(at: Timestamp, since: Timestamp) -> bool {
    if at.subsec_nanosecond() != 0 {
        return at > since;
    }
    // A whole-second stamp: written somewhere in [at, at + 1 s).
    at.as_second() > since.as_second()
}

/// Off, in a status written after `since`, without error.
pub fn off_since(report: &PowerReport, since: Timestamp) -> bool {
    power_since(report, since) == PowerEvidence::Off
}
