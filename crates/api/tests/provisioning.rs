use hostcycle_api::{ProvisioningInputs, ProvisioningState, derive_provisioning_state};

/// (externally, consumer, bmc, registered, annotations, previous, expected)
type Case = (
    bool,
    bool,
    bool,
    bool,
    bool,
    Option<ProvisioningState>,
    ProvisioningState,
);

#[test]
fn derive_provisioning_state_table() {
    use ProvisioningState::*;
    // (externally, consumer, bmc, registered, annotations, previous) -> expected
    let other = Other("inspecting".to_owned());
    let cases: Vec<Case> = vec![
        (true, false, true, true, false, None, ExternallyProvisioned),
        (
            true,
            true,
            true,
            true,
            false,
            Some(Available),
            ExternallyProvisioned,
        ),
        (false, true, true, true, false, None, Provisioned),
        (
            false,
            true,
            false,
            false,
            false,
            Some(Registering),
            Provisioned,
        ),
        // Leaving a provisioned state always goes through deprovisioning.
        (
            false,
            false,
            true,
            true,
            false,
            Some(Provisioned),
            Deprovisioning,
        ),
        (
            false,
            false,
            true,
            true,
            true,
            Some(ExternallyProvisioned),
            Deprovisioning,
        ),
        // Deprovisioning lasts while reboot annotations remain.
        (
            false,
            false,
            true,
            true,
            true,
            Some(Deprovisioning),
            Deprovisioning,
        ),
        (
            false,
            false,
            true,
            true,
            false,
            Some(Deprovisioning),
            Available,
        ),
        // ... and until readings confirm the host off (see below).
        (
            false,
            false,
            false,
            false,
            false,
            Some(Deprovisioning),
            Unmanaged,
        ),
        // Not in use.
        (false, false, false, false, false, None, Unmanaged),
        (false, false, true, false, false, None, Registering),
        (
            false,
            false,
            true,
            true,
            false,
            Some(Registering),
            Available,
        ),
        (false, false, true, true, true, Some(Available), Available),
        (false, false, true, true, false, Some(other), Available),
        // Re-provisioning from deprovisioning.
        (
            false,
            true,
            true,
            true,
            true,
            Some(Deprovisioning),
            Provisioned,
        ),
    ];
    for (i, (ext, consumer, bmc, registered, annotations, previous, expected)) in
        cases.into_iter().enumerate()
    {
        let got = derive_provisioning_state(ProvisioningInputs {
            externally_provisioned: ext,
            has_consumer: consumer,
            image_removed: false,
            bmc_configured: bmc,
            registered,
            reboot_annotations_present: annotations,
            confirmed_off: true,
            previous: previous.as_ref(),
        });
        assert_eq!(got, expected, "case {i}");
    }
}

/// Deprovisioning ends in `available` only once the host controller's readings confirm the
/// host off: a host whose machine still runs (its BMC unreachable, a power-off not yet done)
/// is never offered to a new consumer. Without a BMC address it cannot be confirmed: it is
/// `unmanaged`, never `available`.
#[test]
fn deprovisioning_ends_available_only_once_confirmed_off() {
    use ProvisioningState::*;
    // (bmc configured, annotations, confirmed off) -> expected
    let cases = [
        (true, false, false, Deprovisioning),
        (true, false, true, Available),
        (true, true, true, Deprovisioning),
        (true, true, false, Deprovisioning),
        (false, false, false, Unmanaged),
    ];
    for (bmc, annotations, confirmed_off, expected) in cases {
        let got = derive_provisioning_state(ProvisioningInputs {
            externally_provisioned: false,
            has_consumer: false,
            image_removed: false,
            bmc_configured: bmc,
            registered: true,
            reboot_annotations_present: annotations,
            confirmed_off,
            previous: Some(&Deprovisioning),
        });
        assert_eq!(
            got, expected,
            "bmc {bmc}, annotations {annotations}, off {confirmed_off}"
        );
    }
    // Leaving provisioned always deprovisions first, confirmed off or not.
    for confirmed_off in [false, true] {
        let got = derive_provisioning_state(ProvisioningInputs {
            externally_provisioned: false,
            has_consumer: false,
            image_removed: false,
            bmc_configured: true,
            registered: true,
            reboot_annotations_present: false,
            confirmed_off,
            previous: Some(&Provisioned),
        });
        assert_eq!(got, Deprovisioning);
    }
}

#[test]
fn provisioning_state_strings_are_metal3s() {
    use ProvisioningState::*;
    for (state, s) in [
        (Unmanaged, "unmanaged"),
        (Registering, "registering"),
        (Available, "available"),
        (Provisioned, "provisioned"),
        (ExternallyProvisioned, "externally provisioned"),
        (Deprovisioning, "deprovisioning"),
    ] {
        assert_eq!(state.as_str(), s);
        assert_eq!(ProvisioningState::parse(s), state);
        assert_eq!(state.to_string(), s);
    }
    assert_eq!(ProvisioningState::parse(""), Other(String::new()));
}
