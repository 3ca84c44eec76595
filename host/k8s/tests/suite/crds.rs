//! The CRDs as users install them: current with the types, structural, and showing what
//! `kubectl get` users expect.

use std::path::{Path, PathBuf};

use allot_k8s::{crds, crds_yaml};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

fn repo_crds() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds")
}

fn crd(plural: &str) -> CustomResourceDefinition {
    crds()
        .into_iter()
        .find(|c| c.spec.names.plural == plural)
        .unwrap_or_else(|| panic!("no CRD {plural}"))
}

fn schema(plural: &str) -> serde_json::Value {
    let crd = crd(plural);
    let version = &crd.spec.versions[0];
    serde_json::to_value(&version.schema.as_ref().unwrap().open_api_v3_schema).unwrap()
}

#[test]
fn the_committed_crds_are_what_the_types_generate() {
    let generated = crds_yaml();
    for (name, yaml) in &generated {
        let committed = std::fs::read_to_string(repo_crds().join(name)).unwrap_or_default();
        assert!(
            committed == *yaml,
            "crds/{name} is stale or missing: run `allotctl crds --out crds`"
        );
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(repo_crds())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".allot.dev.yaml"))
        .collect();
    on_disk.sort();
    let mut expected: Vec<String> = generated.into_iter().map(|(n, _)| n).collect();
    expected.sort();
    assert_eq!(
        on_disk, expected,
        "a CRD file in crds/ that no type generates"
    );
}

#[test]
fn every_kind_is_in_allot_dev_v1alpha1_with_the_expected_scope() {
    let kinds: Vec<(String, String, String)> = crds()
        .iter()
        .map(|c| {
            assert_eq!(c.spec.group, "allot.dev");
            assert_eq!(c.spec.versions.len(), 1);
            assert_eq!(c.spec.versions[0].name, "v1alpha1");
            assert!(c.spec.versions[0].served && c.spec.versions[0].storage);
            (
                c.spec.names.kind.clone(),
                c.spec.names.plural.clone(),
                c.spec.scope.clone(),
            )
        })
        .collect();
    let expect = |k: &str, p: &str, s: &str| (k.into(), p.into(), s.into());
    assert_eq!(
        kinds,
        vec![
            expect("IPPool", "ippools", "Cluster"),
            expect("Subnet", "subnets", "Cluster"),
            expect("ReservedIP", "reservedips", "Cluster"),
            expect("Endpoint", "endpoints", "Namespaced"),
            expect("IPBlock", "ipblocks", "Cluster"),
            expect("Policy", "policies", "Cluster"),
            expect("IPAMPool", "ipampools", "Cluster"),
            expect("IPAMAllocation", "ipamallocations", "Namespaced"),
        ]
    );
    assert_eq!(
        crd("ippools").spec.names.short_names,
        Some(vec!["ipp".to_string()])
    );
}

#[test]
fn kubectl_get_ippools_shows_spiderpools_columns() {
    let crd = crd("ippools");
    let columns: Vec<(String, String)> = crd.spec.versions[0]
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| (c.name.clone(), c.json_path.clone()))
        .collect();
    let expect = |n: &str, p: &str| (n.to_string(), p.to_string());
    assert_eq!(
        columns,
        vec![
            expect("VERSION", ".spec.ipVersion"),
            expect("SUBNET", ".spec.subnet"),
            expect("ALLOCATED", ".status.allocatedIPCount"),
            expect("TOTAL", ".status.totalIPCount"),
            expect("DEFAULT", ".spec.default"),
            expect("DISABLE", ".spec.disable"),
        ]
    );
}

#[test]
fn status_is_a_subresource_where_allot_derives_it() {
    for plural in [
        "ippools",
        "subnets",
        "policies",
        "ipampools",
        "ipamallocations",
    ] {
        let crd = crd(plural);
        let sub = crd.spec.versions[0].subresources.as_ref();
        assert!(
            sub.is_some_and(|s| s.status.is_some()),
            "{plural} has a status subresource"
        );
    }
}

#[test]
fn schemas_check_what_a_schema_can_and_stay_structural() {
    let pool = schema("ippools");
    let spec = &pool["properties"]["spec"];
    assert_eq!(spec["required"], serde_json::json!(["subnet"]));
    let props = &spec["properties"];
    assert!(props["subnet"]["pattern"].is_string(), "{props}");
    assert!(props["ips"]["items"]["pattern"].is_string(), "{props}");
    assert!(
        props["excludeIPs"]["items"]["pattern"].is_string(),
        "{props}"
    );
    assert_eq!(props["ipVersion"]["enum"], serde_json::json!([4, 6]));
    for c in crds() {
        let text = serde_json::to_string(&c).unwrap();
        assert!(
            !text.contains("\"additionalProperties\":false"),
            "{}: the API server refuses additionalProperties: false",
            c.spec.names.plural
        );
        for refused in ["\"$ref\"", "\"oneOf\"", "\"anyOf\""] {
            assert!(
                !text.contains(refused),
                "{}: {refused} is not structural",
                c.spec.names.plural
            );
        }
    }
    let policy = schema("policies");
    let source = &policy["properties"]["spec"]["properties"]["source"];
    assert!(
        source["x-kubernetes-validations"][0]["rule"].is_string(),
        "{source}"
    );
}
