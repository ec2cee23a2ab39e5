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
            previous: previous.as_ref(),
        });
        assert_eq!(got, expected, "case {i}");
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
