//! Which of remediation's power-off annotations on a host are orphaned (no remediation owns
//! them any more), as a table.

use hostcycle_api::remediation::{MACHINE_POWER_OFF_ANNOTATION, request_power_off_annotation};
use hostcycle_core::remediation::orphans::orphaned_power_off_keys;

#[test]
fn orphaned_power_off_annotations() {
    let live = request_power_off_annotation("uid-live");
    let gone = request_power_off_annotation("uid-gone");
    let machine = MACHINE_POWER_OFF_ANNOTATION.to_string();
    let someone_else = "reboot.metal3.io/maintenance".to_string();
    let admin = "reboot.metal3.io".to_string();
    let unrelated = "example.com/owner".to_string();
    #[rustfmt::skip]
    let cases: [(&str, Vec<&String>, bool, Vec<&String>); 7] = [
        // (case, annotation keys, a Machine in the flow points at the host, orphaned)
        ("no annotations", vec![], false, vec![]),
        ("other owners' reboot annotations are never touched",
            vec![&admin, &someone_else, &unrelated], false, vec![]),
        ("a live request keeps its annotation", vec![&live], false, vec![]),
        ("a deleted request's annotation is orphaned", vec![&live, &gone], false, vec![&gone]),
        ("the annotation flow's, with a Machine in the flow", vec![&machine], true, vec![]),
        ("the annotation flow's, no Machine in the flow", vec![&machine], false, vec![&machine]),
        ("both kinds orphaned at once", vec![&gone, &machine, &admin], false, vec![&gone, &machine]),
    ];
    for (case, keys, claimed, expected) in cases {
        let orphaned = orphaned_power_off_keys(keys, |uid| uid == "uid-live", || claimed);
        let expected: Vec<String> = expected.into_iter().cloned().collect();
        assert_eq!(orphaned, expected, "{case}");
    }
}

#[test]
fn the_machine_lookup_is_asked_only_for_the_annotation_flows_key() {
    let keys = [
        request_power_off_annotation("uid-gone"),
        "reboot.metal3.io".to_string(),
    ];
    let orphaned = orphaned_power_off_keys(
        &keys,
        |_| false,
        || panic!("asked whether a Machine claims a host without the annotation flow's key"),
    );
    assert_eq!(orphaned, [keys[0].clone()]);
}
