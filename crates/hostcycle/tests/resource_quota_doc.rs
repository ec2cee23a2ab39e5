//! deploy/README.md's ResourceQuota example ("Limiting what tenants create") is a valid
//! ResourceQuota that bounds the objects a tenant makes the operator hold: BareMetalHosts and
//! Secrets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::ResourceQuota;

#[test]
fn the_documented_resource_quota_counts_hosts_and_secrets() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let section = readme
        .split("## Limiting what tenants create")
        .nth(1)
        .expect("deploy/README.md has the section");
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|block| block.split("```").next())
        .expect("a yaml block in the section");
    let quota: ResourceQuota = serde_saphyr::from_str(yaml).unwrap();
    assert_eq!(quota.metadata.name.as_deref(), Some("bare-metal-objects"));
    let hard = quota.spec.unwrap().hard.unwrap();
    for counted in ["count/baremetalhosts.metal3.io", "count/secrets"] {
        let limit = hard
            .get(counted)
            .unwrap_or_else(|| panic!("{counted} in {hard:?}"));
        assert!(
            limit.0.parse::<u32>().is_ok_and(|n| n > 0),
            "{counted}: {limit:?}"
        );
    }
}
