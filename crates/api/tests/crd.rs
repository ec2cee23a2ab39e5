#![allow(clippy::unwrap_used, clippy::expect_used)]

use hostcycle_api::{
    BareMetalHost, OperationalStatus, PowerOffMode, ProvisioningState, RebootRequests, crd,
    crd_yaml,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use serde_json::Value;

const METAL3_FIXTURE: &str = include_str!("fixtures/metal3-bmh.yaml");

fn schema_root(crd: &CustomResourceDefinition) -> &JSONSchemaProps {
    crd.spec.versions[0]
        .schema
        .as_ref()
        .unwrap()
        .open_api_v3_schema
        .as_ref()
        .unwrap()
}

fn prop<'a>(schema: &'a JSONSchemaProps, path: &[&str]) -> &'a JSONSchemaProps {
    path.iter().fold(schema, |s, name| {
        s.properties
            .as_ref()
            .and_then(|p| p.get(*name))
            .unwrap_or_else(|| panic!("schema has no property {name}"))
    })
}

#[test]
fn crd_identity_and_names() {
    let crd = crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("baremetalhosts.metal3.io")
    );
    assert_eq!(crd.spec.group, "metal3.io");
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.kind, "BareMetalHost");
    assert_eq!(crd.spec.names.plural, "baremetalhosts");
    // metal3's short names: `kubectl get bmhost` works as with metal3's own CRD.
    assert_eq!(
        crd.spec.names.short_names,
        Some(vec!["bmh".to_owned(), "bmhost".to_owned()])
    );
    assert_eq!(crd.spec.versions.len(), 1);
    assert_eq!(crd.spec.versions[0].name, "v1alpha1");
    assert!(crd.spec.versions[0].served && crd.spec.versions[0].storage);
}

#[test]
fn crd_has_status_subresource() {
    let crd = crd();
    let sub = crd.spec.versions[0].subresources.as_ref().unwrap();
    assert!(sub.status.is_some(), "status subresource missing");
}

#[test]
fn crd_has_metal3_print_columns_and_the_observed_power_state() {
    let crd = crd();
    let columns: Vec<(String, String, String, i32)> = crd.spec.versions[0]
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                c.json_path.clone(),
                c.type_.clone(),
                c.priority.unwrap_or(0),
            )
        })
        .collect();
    // metal3's columns in metal3's order, types and priorities (`-o wide` shows Status and
    // BMC), and hostcycle's observed power state in the wide view.
    let expected = [
        ("Status", ".status.operationalStatus", "string", 1),
        ("State", ".status.provisioning.state", "string", 0),
        ("Consumer", ".spec.consumerRef.name", "string", 0),
        ("BMC", ".spec.bmc.address", "string", 1),
        ("Online", ".spec.online", "string", 0),
        ("Error", ".status.errorType", "string", 0),
        ("PoweredOn", ".status.poweredOn", "boolean", 1),
        ("Age", ".metadata.creationTimestamp", "date", 0),
    ];
    let expected: Vec<(String, String, String, i32)> = expected
        .iter()
        .map(|(n, p, t, priority)| (n.to_string(), p.to_string(), t.to_string(), *priority))
        .collect();
    assert_eq!(columns, expected);
}

#[test]
fn crd_preserves_unknown_fields_on_spec_status_and_provisioning() {
    let crd = crd();
    let root = schema_root(&crd);
    for path in [
        &["spec"][..],
        &["status"][..],
        &["status", "provisioning"][..],
    ] {
        let schema = prop(root, path);
        assert_eq!(
            schema.x_kubernetes_preserve_unknown_fields,
            Some(true),
            "{path:?} must preserve unknown fields"
        );
        // Structural schemas forbid additionalProperties next to properties.
        assert!(schema.additional_properties.is_none(), "{path:?}");
    }
    assert_eq!(
        prop(root, &["spec"]).required,
        Some(vec!["online".to_owned()])
    );
}

#[test]
fn crd_timestamps_are_date_time_strings() {
    let crd = crd();
    let root = schema_root(&crd);
    for field in ["lastPoweredOn", "pendingRebootSince"] {
        let schema = prop(root, &["status", "provisioning", field]);
        assert_eq!(schema.type_.as_deref(), Some("string"), "{field}");
        assert_eq!(schema.format.as_deref(), Some("date-time"), "{field}");
    }
    for field in ["requestedAt", "lastAttemptAt", "completedAt"] {
        let schema = prop(root, &["status", "lastPowerAction", field]);
        assert_eq!(schema.format.as_deref(), Some("date-time"), "{field}");
    }
    // metal3's status.lastUpdated.
    let schema = prop(root, &["status", "lastUpdated"]);
    assert_eq!(schema.format.as_deref(), Some("date-time"));
}

#[test]
fn crd_has_metal3_disable_power_off_and_status_fields() {
    let crd = crd();
    let root = schema_root(&crd);
    let schema = prop(root, &["spec", "disablePowerOff"]);
    assert_eq!(schema.type_.as_deref(), Some("boolean"));
    let schema = prop(root, &["status", "poweredOn"]);
    assert_eq!(schema.type_.as_deref(), Some("boolean"));
    let schema = prop(root, &["status", "provisioning", "pendingRebootMode"]);
    assert_eq!(schema.type_.as_deref(), Some("string"));
}

#[test]
fn crd_uses_metal3_enum_strings() {
    let crd = crd();
    let root = schema_root(&crd);
    let values = |path: &[&str]| -> Vec<String> {
        prop(root, path)
            .enum_
            .as_ref()
            .unwrap()
            .iter()
            .map(|v| v.0.as_str().unwrap().to_owned())
            .collect()
    };
    // Every value metal3 writes, including "" (metal3 never omits `operationalStatus`).
    let operational = values(&["status", "operationalStatus"]);
    for s in [
        "",
        "OK",
        "discovered",
        "error",
        "delayed",
        "detached",
        "servicing",
    ] {
        assert!(operational.contains(&s.to_owned()), "{s}");
    }
    let errors = values(&["status", "errorType"]);
    for s in [
        "",
        "inspection error",
        "preparation error",
        "provisioning error",
        "servicing error",
        "registration error",
        "provisioned registration error",
        "power management error",
    ] {
        assert!(errors.contains(&s.to_owned()), "{s}");
    }
    // Provisioning state is a free string: metal3 objects carry states we never write.
    assert!(
        prop(root, &["status", "provisioning", "state"])
            .enum_
            .is_none()
    );
}

#[test]
fn conditions_are_a_map_list_keyed_by_type() {
    let crd = crd();
    let conditions = prop(schema_root(&crd), &["status", "conditions"]);
    assert_eq!(conditions.x_kubernetes_list_type.as_deref(), Some("map"));
    assert_eq!(
        conditions.x_kubernetes_list_map_keys,
        Some(vec!["type".to_owned()])
    );
}

#[test]
fn crd_yaml_round_trips_to_the_same_crd() {
    let yaml = crd_yaml().unwrap();
    assert!(yaml.contains("x-kubernetes-preserve-unknown-fields: true"));
    assert!(yaml.contains("shortNames"));
    let parsed: CustomResourceDefinition = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(parsed, crd());
}

/// Drops `spec.externallyProvisioned: false`, which we do not re-emit (false is the default).
fn normalize(mut v: Value) -> Value {
    if let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut)
        && spec.get("externallyProvisioned") == Some(&Value::Bool(false))
    {
        spec.remove("externallyProvisioned");
    }
    // An empty errorMessage means "no error" and is not written back (Kubernetes 1.20 reads
    // "" inside custom resources as null).
    if let Some(status) = v.get_mut("status").and_then(Value::as_object_mut)
        && status.get("errorMessage") == Some(&Value::String(String::new()))
    {
        status.remove("errorMessage");
    }
    v
}

#[test]
fn metal3_manifest_deserializes_into_our_type() {
    let host: BareMetalHost = serde_saphyr::from_str(METAL3_FIXTURE).unwrap();
    assert!(host.spec.online);
    let bmc = host.spec.bmc.as_ref().unwrap();
    assert_eq!(bmc.credentials_name, "worker-0-bmc-secret");
    assert_eq!(bmc.disable_certificate_verification, Some(true));
    assert_eq!(
        host.spec.boot_mac_address.as_deref(),
        Some("00:5c:52:31:3a:9c")
    );
    assert_eq!(
        host.spec.consumer_ref.as_ref().unwrap().kind.as_deref(),
        Some("Metal3Machine")
    );
    assert!(!host.spec.externally_provisioned);
    assert!(host.spec.extra.contains_key("rootDeviceHints"));
    assert!(host.spec.extra.contains_key("image"));
    assert!(host.spec.extra.contains_key("hardwareProfile"));

    let status = host.status.as_ref().unwrap();
    assert_eq!(status.powered_on, Some(true));
    assert_eq!(status.operational_status, Some(OperationalStatus::Ok));
    assert_eq!(
        status.provisioning.state,
        Some(ProvisioningState::Provisioned)
    );
    assert_eq!(
        status.provisioning.extra.get("ID"),
        Some(&Value::String(
            "0b6f2e4a-4a8c-4d3f-9a55-2d1c7c1e9f01".into()
        ))
    );
    assert!(status.extra.contains_key("hardware"));
    assert!(status.extra.contains_key("operationHistory"));
    let good = status.good_credentials.as_ref().unwrap();
    assert_eq!(good.credentials_version.as_deref(), Some("1842"));
    let lpo = status.provisioning.last_powered_on.unwrap();
    let prs = status.provisioning.pending_reboot_since.unwrap();
    assert_eq!(lpo.subsec_nanosecond(), 123_456_789);
    assert!(prs > lpo, "same second, ordered by the fraction");

    let requests = RebootRequests::from_annotations(host.annotations_or_empty());
    assert_eq!(requests.keyed_keys(), vec!["capbm-requested-power-off"]);
    assert_eq!(requests.effective_mode(), PowerOffMode::Hard);
}

#[test]
fn metal3_manifest_round_trips_without_losing_fields() {
    let original: Value = serde_saphyr::from_str(METAL3_FIXTURE).unwrap();
    let host: BareMetalHost = serde_saphyr::from_str(METAL3_FIXTURE).unwrap();
    let json_round_trip = serde_json::to_value(&host).unwrap();
    assert_eq!(
        normalize(json_round_trip.clone()),
        normalize(original.clone())
    );

    // And through JSON text, as the API server sees it.
    let again: BareMetalHost = serde_json::from_value(json_round_trip).unwrap();
    assert_eq!(again, host);

    // Spot checks on fields we do not model.
    let v = serde_json::to_value(&again).unwrap();
    assert_eq!(v["spec"]["rootDeviceHints"]["minSizeGigabytes"], 100);
    assert_eq!(
        v["status"]["provisioning"]["ID"],
        original["status"]["provisioning"]["ID"]
    );
    assert_eq!(
        v["status"]["hardware"]["storage"][0]["sizeBytes"],
        480103981056_u64
    );
    assert_eq!(
        v["status"]["operationHistory"]["deprovision"]["end"],
        Value::Null
    );
}

#[test]
fn timestamps_keep_sub_second_precision() {
    let host: BareMetalHost = serde_saphyr::from_str(METAL3_FIXTURE).unwrap();
    let v = serde_json::to_value(&host).unwrap();
    assert_eq!(
        v["status"]["provisioning"]["lastPoweredOn"],
        "2025-03-04T10:09:29.123456789Z"
    );
    assert_eq!(
        v["status"]["provisioning"]["pendingRebootSince"],
        "2025-03-04T10:09:29.5Z"
    );
}

#[test]
fn minimal_manifest_and_unknown_metal3_state() {
    let yaml = r#"
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata: {name: bare, namespace: default}
spec: {online: false}
status:
  provisioning: {state: inspecting}
  operationalStatus: delayed
"#;
    let host: BareMetalHost = serde_saphyr::from_str(yaml).unwrap();
    assert!(!host.spec.online);
    assert!(host.spec.bmc.is_none());
    let status = host.status.as_ref().unwrap();
    assert_eq!(
        status.provisioning.state,
        Some(ProvisioningState::Other("inspecting".into()))
    );
    assert_eq!(status.operational_status, Some(OperationalStatus::Delayed));
    let v = serde_json::to_value(&host).unwrap();
    assert_eq!(v["status"]["provisioning"]["state"], "inspecting");
    assert_eq!(v["status"]["operationalStatus"], "delayed");
}

fn columns(crd: &CustomResourceDefinition) -> Vec<(String, String)> {
    crd.spec.versions[0]
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| (c.name.clone(), c.json_path.clone()))
        .collect()
}

#[test]
fn reboot_queue_crds_are_cluster_scoped_with_short_names_and_status() {
    let crds = hostcycle_api::crds();
    let names: Vec<&str> = crds
        .iter()
        .map(|c| c.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "baremetalhosts.metal3.io",
            "rebootqueues.hostcycle.io",
            "rebootqueueentries.hostcycle.io",
            "hostremediations.hostcycle.io",
            "hostremediationtemplates.hostcycle.io",
            "hosthealthchecks.hostcycle.io",
        ]
    );
    for (crd, short) in [(&crds[1], "rq"), (&crds[2], "rqe")] {
        assert_eq!(crd.spec.group, "hostcycle.io");
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.short_names, Some(vec![short.to_owned()]));
        assert_eq!(crd.spec.versions[0].name, "v1alpha1");
        assert!(
            crd.spec.versions[0]
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some()),
            "{short}: status subresource (the controller writes only status)"
        );
    }
}

#[test]
fn kubectl_get_rqe_shows_index_node_phase_backoff_and_message() {
    let crds = hostcycle_api::crds();
    let cols = columns(&crds[2]);
    for (name, path) in [
        ("Index", ".spec.index"),
        ("Node", ".spec.node"),
        ("Phase", ".status.phase"),
        ("Backoff-Until", ".status.drainBackoffExpire"),
        ("Message", ".status.message"),
    ] {
        assert!(
            cols.contains(&(name.to_string(), path.to_string())),
            "column {name} ({path}) in {cols:?}"
        );
    }
    let queue_cols = columns(&crds[1]);
    for path in [".status.enabled", ".status.running", ".status.queued"] {
        assert!(
            queue_cols.iter().any(|(_, p)| p == path),
            "{path} in {queue_cols:?}"
        );
    }
}

#[test]
fn an_empty_reboot_queue_spec_round_trips_as_defaults() {
    use hostcycle_api::queue::{RebootQueueEntry, RebootQueueSpec};
    let spec: RebootQueueSpec = serde_json::from_value(serde_json::json!({})).unwrap();
    assert_eq!(spec, RebootQueueSpec::default());
    assert_eq!(serde_json::to_value(&spec).unwrap(), serde_json::json!({}));
    let entry = RebootQueueEntry::for_node("worker-3", 12);
    let v = serde_json::to_value(&entry).unwrap();
    assert_eq!(v["metadata"]["name"], "rqe-0000000012");
    assert_eq!(
        v["spec"],
        serde_json::json!({ "node": "worker-3", "index": 12 })
    );
}

/// `commandTimeoutSeconds: 0` is CKE's "no timeout": the schema admits it (and nothing
/// negative), and it round-trips as 0, not as an absent field.
#[test]
fn a_zero_command_timeout_is_admitted_and_kept() {
    use hostcycle_api::queue::RebootQueueSpec;
    let crds = hostcycle_api::crds();
    let timeout = prop(
        schema_root(&crds[1]),
        &["spec", "reboot", "commandTimeoutSeconds"],
    );
    assert_eq!(timeout.type_.as_deref(), Some("integer"));
    assert_eq!(timeout.minimum, Some(0.0), "0 must pass validation");
    let spec: RebootQueueSpec = serde_json::from_value(serde_json::json!({
        "reboot": { "commandTimeoutSeconds": 0 }
    }))
    .unwrap();
    assert_eq!(
        spec.reboot.as_ref().and_then(|r| r.command_timeout_seconds),
        Some(0)
    );
    assert_eq!(
        serde_json::to_value(&spec).unwrap(),
        serde_json::json!({ "reboot": { "commandTimeoutSeconds": 0 } })
    );
}

#[test]
fn remediation_crds_are_namespaced_and_the_request_has_a_status() {
    let crds = hostcycle_api::crds();
    let (request, template) = (&crds[3], &crds[4]);
    for (crd, short) in [(request, "hr"), (template, "hrt")] {
        assert_eq!(crd.spec.group, "hostcycle.io");
        assert_eq!(
            crd.spec.scope, "Namespaced",
            "{short}: health checkers create them next to the Machine or the template"
        );
        assert_eq!(crd.spec.names.short_names, Some(vec![short.to_owned()]));
    }
    assert_eq!(request.spec.names.kind, "HostRemediation");
    assert_eq!(
        template.spec.names.kind, "HostRemediationTemplate",
        "checkers derive the request's kind by removing the Template suffix"
    );
    assert!(
        request.spec.versions[0]
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some())
    );
    let cols = columns(request);
    for path in [".status.phase", ".status.node", ".status.retryCount"] {
        assert!(cols.iter().any(|(_, p)| p == path), "{path} in {cols:?}");
    }
}

/// A template must carry `spec.template.spec` (Cluster API tolerates a template without
/// `spec.template` and NodeHealthCheck copies a missing spec as nothing: every request made
/// from it would say nothing), and keeps `spec.template.metadata` (labels, annotations),
/// which Cluster API's MachineHealthCheck copies onto each request.
#[test]
fn the_template_requires_its_spec_and_keeps_its_metadata() {
    let crds = hostcycle_api::crds();
    let template = &crds[4];
    let root = schema_root(template);
    let spec = prop(root, &["spec"]);
    assert_eq!(spec.required, Some(vec!["template".to_owned()]));
    let resource = prop(root, &["spec", "template"]);
    assert_eq!(
        resource.required,
        Some(vec!["spec".to_owned()]),
        "`template: {{}}` is refused"
    );
    for part in ["labels", "annotations"] {
        let map = prop(root, &["spec", "template", "metadata", part]);
        assert_eq!(map.type_.as_deref(), Some("object"), "{part}");
        assert!(map.additional_properties.is_some(), "{part}: a string map");
    }
    // Only the strategy hostcycle has: another type is refused, never run as a reboot.
    for crd in [&crds[3], template] {
        let root = schema_root(crd);
        let path: &[&str] = if crd.spec.names.kind == "HostRemediation" {
            &["spec", "strategy", "type"]
        } else {
            &["spec", "template", "spec", "strategy", "type"]
        };
        let values: Vec<String> = prop(root, path)
            .enum_
            .as_ref()
            .unwrap()
            .iter()
            .map(|v| v.0.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(values, ["Reboot"], "{}", crd.spec.names.kind);
    }
}

/// metal3 writes `goodCredentials: {}` and `poweredOn: false` before its BMC ever answered:
/// that is no evidence the host is off (a remediation must not release a Node on it).
#[test]
fn metal3_empty_good_credentials_are_no_evidence_of_power() {
    let status: hostcycle_api::host::BareMetalHostStatus =
        serde_json::from_value(serde_json::json!({
            "operationalStatus": "",
            "errorMessage": "",
            "errorCount": 0,
            "poweredOn": false,
            "goodCredentials": {},
            "triedCredentials": {},
            "provisioning": { "state": "", "ID": "" },
        }))
        .unwrap();
    assert_eq!(status.operational_status, None);
    assert_eq!(status.good_credentials, None);
    assert_eq!(status.observed_powered_on(), None);
    let worked: hostcycle_api::host::BareMetalHostStatus =
        serde_json::from_value(serde_json::json!({
            "operationalStatus": "OK",
            "poweredOn": false,
            "goodCredentials": { "credentials": { "name": "bmc", "namespace": "m" } },
        }))
        .unwrap();
    assert_eq!(worked.observed_powered_on(), Some(false));
}

/// The host fields hostcycle reads are bounded in the schema, with limits metal3's and
/// Kubernetes' own values fit in (object names 253, namespaces 63, a group/version 317), so
/// a host cannot make both replicas hold megabytes per field.
#[test]
fn crd_bounds_the_host_fields_hostcycle_reads() {
    let crd = crd();
    let root = schema_root(&crd);
    let max = |path: &[&str]| -> Option<i64> { prop(root, path).max_length };
    assert_eq!(max(&["spec", "bmc", "address"]), Some(2048));
    assert_eq!(max(&["spec", "bmc", "credentialsName"]), Some(253));
    assert_eq!(max(&["spec", "bootMACAddress"]), Some(128));
    for (field, limit) in [
        ("name", 253),
        ("namespace", 63),
        ("kind", 253),
        ("apiVersion", 317),
        ("uid", 128),
        ("resourceVersion", 256),
        ("fieldPath", 1024),
    ] {
        assert_eq!(
            max(&["spec", "consumerRef", field]),
            Some(limit),
            "consumerRef.{field}"
        );
    }
    assert_eq!(
        (
            hostcycle_api::host::MAX_BMC_ADDRESS_LEN,
            hostcycle_api::host::MAX_NAME_LEN,
            hostcycle_api::host::MAX_NAMESPACE_LEN
        ),
        (2048, 253, 63),
        "the code checks what the schema says"
    );
    // metal3's example host, as metal3 writes it, is within every limit.
    let host: BareMetalHost = serde_saphyr::from_str(METAL3_FIXTURE).unwrap();
    let bmc = host.spec.bmc.as_ref().unwrap();
    assert!(bmc.check_bounds().is_ok());
}

/// A host written before the limits (or under metal3's CRD) with a longer value: refused by
/// name of the field, the value never in the message.
#[test]
fn an_over_long_bmc_field_is_refused_without_its_value() {
    use hostcycle_api::host::{BmcDetails, BmcSpecRefused};
    let bmc = |address: String, credentials_name: &str| BmcDetails {
        address,
        credentials_name: credentials_name.into(),
        disable_certificate_verification: None,
    };
    let at_limit = format!("redfish://10.0.0.5/{}", "x".repeat(2048 - 19));
    assert_eq!(at_limit.len(), 2048);
    assert_eq!(bmc(at_limit.clone(), "creds").check_bounds(), Ok(()));
    let over = bmc(format!("{at_limit}y"), "creds")
        .check_bounds()
        .unwrap_err();
    assert_eq!(over, BmcSpecRefused::AddressTooLong);
    assert!(!over.to_string().contains("xxxx"), "{over}");
    for name in [
        "Creds",
        "creds/../x",
        "-creds",
        &"c".repeat(254),
        "creds..x",
    ] {
        let refused = bmc("ipmi://10.0.0.5".into(), name)
            .check_bounds()
            .unwrap_err();
        assert_eq!(refused, BmcSpecRefused::BadCredentialsName, "{name}");
        assert!(!refused.to_string().contains(name), "{refused}");
    }
    for name in ["creds", "bmc-0.creds", &"c".repeat(253), ""] {
        assert_eq!(
            bmc("ipmi://10.0.0.5".into(), name).check_bounds(),
            Ok(()),
            "{name}"
        );
    }
}

#[test]
fn the_health_check_crd_is_cluster_scoped_with_validated_settings() {
    let crds = hostcycle_api::crds();
    let crd = crds
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some("hosthealthchecks.hostcycle.io"))
        .unwrap();
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["hhc".to_string()][..])
    );
    let json = serde_json::to_value(crd).unwrap();
    let version = &json["spec"]["versions"][0];
    assert!(version["subresources"]["status"].is_object());
    let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(spec["required"], serde_json::json!(["selector"]));
    let props = &spec["properties"];
    assert_eq!(props["leaseStaleAfterSeconds"]["minimum"], 10.0);
    assert_eq!(props["stormPercent"]["maximum"], 100.0);
    assert_eq!(props["maxUnhealthy"]["x-kubernetes-int-or-string"], true);
    assert_eq!(
        props["remediation"]["properties"]["release"]["enum"],
        serde_json::json!([
            "DeleteNode",
            "ReleaseWorkloads",
            "OutOfServiceTaint",
            "Auto"
        ])
    );
    let names: Vec<String> = columns(crd).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "Observed",
            "Healthy",
            "Unhealthy",
            "Storm",
            "Suspended",
            "Age"
        ]
    );
}
