//! BMC emulators for tests and the lab, each a real server process on 127.0.0.1:
//!
//! - [`RedfishEmulator`]: sushy-tools' `sushy-emulator` with its fake driver (any number of
//!   systems, optional basic auth and TLS). Power changes land 1–11 s after a request.
//! - [`FakeIpmiBmc`]: a pyghmi-based IPMI (RMCP+) BMC for one host, driven with
//!   `ipmitool -I lanplus -C 3`.
//!
//! Both need the Python venv made by `scripts/install-prereqs.sh`; without it they fail with a
//! message saying to run that script. Each keeps its files in its own temp dir and stops its
//! process by PID when dropped.

mod ipmi;
mod redfish;

pub use ipmi::FakeIpmiBmc;
pub use redfish::{FakeSystem, RedfishEmulator, RedfishEmulatorOptions};

use std::time::Duration;

use crate::TestkitError;

/// A fake host's power state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FakePower {
    On,
    Off,
}

impl FakePower {
    /// Redfish spelling: `On` / `Off`.
    pub fn redfish(self) -> &'static str {
        match self {
            FakePower::On => "On",
            FakePower::Off => "Off",
        }
    }

    /// ipmitool/pyghmi spelling: `on` / `off`.
    pub fn ipmi(self) -> &'static str {
        match self {
            FakePower::On => "on",
            FakePower::Off => "off",
        }
    }

    fn parse(text: &str) -> Option<FakePower> {
        match text.trim().to_ascii_lowercase().as_str() {
            "on" => Some(FakePower::On),
            "off" => Some(FakePower::Off),
            _ => None,
        }
    }
}

/// How long an emulator gets to start answering.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);

fn other(what: impl Into<String>, message: impl ToString) -> TestkitError {
    TestkitError::Other {
        what: what.into(),
        message: message.to_string(),
    }
}

/// A string as a Python literal (JSON strings are valid Python strings).
fn py_str(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}
