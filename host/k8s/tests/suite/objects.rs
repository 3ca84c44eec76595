//! The objects users write: every sample in examples/kubernetes reads as its type, and a pool
//! object means exactly what the same document means to the standalone loader.

use std::path::Path;

use allot_core::config::{Object, Observation};
use allot_core::fleet::FleetPool;
use allot_core::{Pool, Reserved, Subnet};
use allot_k8s::{
    Endpoint, IPAMAllocation, IPAMPool, IPBlock, IPPool, LocationError, Policy, PolicyLocation,
    ReservedIP, Subnet as SubnetObject,
};
use serde::Deserialize;

fn examples() -> Vec<(String, serde_yaml::Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kubernetes");
    let mut docs = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(doc).unwrap();
            if !value.is_null() {
                docs.push((path.display().to_string(), value));
            }
        }
    }
    docs
}

fn standalone(text: &str) -> Observation {
    let mut out = Observation::default();
    allot_core::documents::observe_text(text, "test", &mut out);
    out
}

#[test]
fn every_sample_reads_as_its_kind_and_every_kind_has_a_sample() {
    let mut kinds = std::collections::BTreeSet::new();
    for (file, doc) in examples() {
        let kind = doc["kind"].as_str().unwrap().to_string();
        let parsed = match kind.as_str() {
            "IPPool" => serde_yaml::from_value::<IPPool>(doc.clone())
                .map_err(|e| e.to_string())
                .and_then(|p| Pool::try_from(&p).map(drop).map_err(|e| e.to_string())),
            "Subnet" => serde_yaml::from_value::<SubnetObject>(doc.clone())
                .map_err(|e| e.to_string())
                .and_then(|s| Subnet::try_from(&s).map(drop).map_err(|e| e.to_string())),
            "ReservedIP" => serde_yaml::from_value::<ReservedIP>(doc.clone())
                .map_err(|e| e.to_string())
                .and_then(|r| Reserved::try_from(&r).map(drop).map_err(|e| e.to_string())),
            "Endpoint" => serde_yaml::from_value::<Endpoint>(doc.clone())
                .map(drop)
                .map_err(|e| e.to_string()),
            "IPBlock" => serde_yaml::from_value::<IPBlock>(doc.clone())
                .map(drop)
                .map_err(|e| e.to_string()),
            "Policy" => serde_yaml::from_value::<Policy>(doc.clone())
                .map_err(|e| e.to_string())
                .and_then(|p| {
                    p.spec
                        .source
                        .location()
                        .map(drop)
                        .map_err(|e| e.to_string())
                }),
            "IPAMPool" => serde_yaml::from_value::<IPAMPool>(doc.clone())
                .map_err(|e| e.to_string())
                .and_then(|p| {
                    p.spec
                        .datacenters
                        .values()
                        .try_for_each(|dc| FleetPool::try_from(dc).map(drop))
                        .map_err(|e| e.to_string())
                }),
            "IPAMAllocation" => serde_yaml::from_value::<IPAMAllocation>(doc.clone())
                .map_err(|e| e.to_string())
                .and_then(|a| a.spec.allocation().map(drop).map_err(|e| e.to_string())),
            // Workloads that ask for auto pools (examples/kubernetes/subnet-auto-pools.yaml).
            "Deployment" => {
                serde_yaml::from_value::<k8s_openapi::api::apps::v1::Deployment>(doc.clone())
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
            "StatefulSet" => {
                serde_yaml::from_value::<k8s_openapi::api::apps::v1::StatefulSet>(doc.clone())
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
            "CronJob" => {
                serde_yaml::from_value::<k8s_openapi::api::batch::v1::CronJob>(doc.clone())
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
            // A workload of another kind with a scale subresource (OpenKruise's CloneSet):
            // what the controller reads of it is its pod template.
            "CloneSet" => serde_yaml::from_value::<k8s_openapi::api::core::v1::PodTemplateSpec>(
                doc["spec"]["template"].clone(),
            )
            .map(drop)
            .map_err(|e| e.to_string()),
            // A KubeVirt VirtualMachine (examples/kubernetes/virtual-machine.yaml): allot reads
            // nothing of it but its name; its underlay network must name a Multus network.
            "VirtualMachine" => doc["spec"]["template"]["spec"]["networks"]
                .as_sequence()
                .into_iter()
                .flatten()
                .find_map(|n| n["multus"]["networkName"].as_str())
                .map(drop)
                .ok_or_else(|| "no Multus network".to_string()),
            other => Err(format!("unknown kind {other}")),
        };
        if let Err(e) = parsed {
            panic!("{file}: {kind}: {e}");
        }
        kinds.insert(kind);
    }
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        [
            "CloneSet",
            "CronJob",
            "Deployment",
            "Endpoint",
            "IPAMAllocation",
            "IPAMPool",
            "IPBlock",
            "IPPool",
            "Policy",
            "ReservedIP",
            "StatefulSet",
            "Subnet",
            "VirtualMachine"
        ]
    );
}

#[test]
fn a_pool_object_is_the_pool_the_standalone_loader_reads() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kubernetes/pools.yaml"),
    )
    .unwrap();
    let loaded = standalone(&text);
    assert!(loaded.incomplete.is_empty(), "{:?}", loaded.incomplete);
    let mut compared = 0;
    // The pools of pools.yaml, which the standalone loader just read (other examples declare
    // pools of their own, such as declared-addresses.yaml's).
    for (_, doc) in examples()
        .into_iter()
        .filter(|(path, d)| path.ends_with("/pools.yaml") && d["kind"] == "IPPool")
    {
        let object: IPPool = serde_yaml::from_value(doc).unwrap();
        let from_cluster = Pool::try_from(&object).unwrap();
        let from_file = loaded
            .objects
            .iter()
            .find_map(|o| match &o.object {
                Ok(Object::Pool(p)) if p.meta.name == from_cluster.meta.name => Some(p.clone()),
                _ => None,
            })
            .expect("the standalone loader read the same pool");
        // (Pool has no PartialEq: compare every field through Debug.)
        assert_eq!(format!("{from_file:?}"), format!("{from_cluster:?}"));
        compared += 1;
    }
    assert_eq!(compared, 3);
}

#[test]
fn an_invalid_pool_is_refused_with_the_standalone_loaders_words() {
    let text = "apiVersion: allot.dev/v1alpha1\nkind: IPPool\nmetadata:\n  name: bad\nspec:\n  \
                subnet: 10.0.0.0/24\n  gateway: 10.0.1.1\n";
    let object: IPPool = serde_yaml::from_str(text).unwrap();
    let from_cluster = Pool::try_from(&object).unwrap_err().to_string();
    let loaded = standalone(text);
    let from_file = match &loaded.objects[0].object {
        Err(invalid) => invalid.error.clone(),
        Ok(_) => panic!("the standalone loader accepted it"),
    };
    assert_eq!(from_cluster, from_file);
    assert!(from_cluster.contains("gateway"), "{from_cluster}");
}

#[test]
fn an_unknown_spec_field_is_an_error_naming_it() {
    let text = "apiVersion: allot.dev/v1alpha1\nkind: IPPool\nmetadata:\n  name: typo\nspec:\n  \
                subnet: 10.0.0.0/24\n  nodename: [a]\n";
    let e = serde_yaml::from_str::<IPPool>(text)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nodename"), "{e}");
}

#[test]
fn a_policy_source_has_exactly_one_location() {
    let source = |yaml: &str| -> allot_k8s::PolicySource { serde_yaml::from_str(yaml).unwrap() };
    assert_eq!(
        source("file: /var/lib/allot/policy.wasm").location(),
        Ok(PolicyLocation::File("/var/lib/allot/policy.wasm"))
    );
    assert_eq!(source("{}").location(), Err(LocationError { count: 0 }));
    assert!(
        source("{}")
            .location()
            .unwrap_err()
            .to_string()
            .contains("exactly one")
    );
    assert!(
        source("file: /p.wasm\noci: oci://r/p:1")
            .location()
            .unwrap_err()
            .to_string()
            .contains("has 2")
    );
}
