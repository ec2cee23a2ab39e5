//! Where a simulated host learns whether it has power: its BMC, read through hostcycle's BMC
//! layer exactly as the operator reads it (Redfish or IPMI).

use std::time::Duration;

use hostcycle_bmc::{BmcConnector, ConnectorOptions, PowerDriver, PowerState, RetryPolicy};

/// The power state of a simulated host, as its BMC reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPower {
    On,
    Off,
}

/// What a host makes of a reading: `None` while the BMC reports a transition or an unknown
/// state (a transition is not yet a power change).
pub fn host_power(state: PowerState) -> Option<HostPower> {
    match state {
        PowerState::On => Some(HostPower::On),
        PowerState::Off => Some(HostPower::Off),
        PowerState::Transitioning | PowerState::Unknown => None,
    }
}

/// Reads the host's power through its driver; an error comes back as text for the log.
pub async fn read_power(driver: &dyn PowerDriver) -> Result<Option<HostPower>, String> {
    driver
        .power_state()
        .await
        .map(host_power)
        .map_err(|e| e.to_string())
}

/// A connector for simulated hosts: one quick attempt per reading, since the host reads
/// again half a second later anyway and must never stall on a BMC that is down.
pub fn bmc_connector() -> BmcConnector {
    BmcConnector::new(ConnectorOptions {
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        retry: RetryPolicy::no_retries(Duration::from_secs(3)),
        ..ConnectorOptions::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings() {
        assert_eq!(host_power(PowerState::On), Some(HostPower::On));
        assert_eq!(host_power(PowerState::Off), Some(HostPower::Off));
        assert_eq!(host_power(PowerState::Transitioning), None);
        assert_eq!(host_power(PowerState::Unknown), None);
    }
}
