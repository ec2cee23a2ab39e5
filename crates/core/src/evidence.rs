//! How fresh the evidence is that a host is off (or on).
//!
//! A host's `status.poweredOn` is what its controller last wrote, not what the machine does
//! now: a host held off whose BMC then stops answering keeps `poweredOn: false` while someone
//! powers the machine on at the BMC, and metal3's operator may simply be behind. Before an
//! irreversible step (deleting a Node, so its workloads start elsewhere) the power state must
//! come from a status written *after* the request that caused the step, by a controller that
//! reports no error:
//! - hostcycle's host controller writes status only after a BMC read, with a resourceVersion
//!   precondition, so a status written after a request was decided with that request seen;
//! - metal3's baremetal-operator stamps every status write with `status.lastUpdated`.
//!
//! Both write `status.lastUpdated`, so one rule serves both: `lastUpdated` later than the
//! request, and no error. metal3 writes it with whole seconds (`metav1.Time`): a stamp without
//! a fraction stands for any moment of its second, so it counts only from the first whole
//! second after the request. The request time and `lastUpdated` come from the clocks of the
//! two controllers (the same process for hostcycle's own); they must agree to well within a
//! second, as NTP keeps them.

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
