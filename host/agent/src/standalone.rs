//! Standalone mode's inventory: IPPool, Subnet and ReservedIP objects from the YAML files of a
//! directory, checked one by one and across pools. An invalid object is reported and left out;
//! the valid ones keep serving.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use allot_core::pool::check_pools;
use allot_core::spec::{IpPoolSpec, ObjectMeta, ReservedIpSpec, SubnetSpec};
use allot_core::{Pool, Reserved, Subnet};
use serde::Deserialize;

pub const API_VERSION: &str = "allot.dev/v1alpha1";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Object {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: serde_yaml::Value,
    /// Status is derived by allot; a copy in the files is ignored.
    #[serde(default)]
    #[allow(dead_code)]
    status: serde_yaml::Value,
}

#[derive(Debug, Default)]
pub struct Loaded {
    pub pools: Vec<Pool>,
    pub subnets: Vec<Subnet>,
    pub reserved: Vec<Reserved>,
    /// One line per object (or file) left out, naming it and what is wrong.
    pub errors: Vec<String>,
}

/// The YAML files of `dir`, sorted.
fn files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file() && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// A fingerprint of the directory's YAML files (names and contents): reload when it changes.
pub fn fingerprint(dir: &Path) -> std::io::Result<u64> {
    let mut h = DefaultHasher::new();
    for f in files(dir)? {
        f.hash(&mut h);
        std::fs::read(&f)?.hash(&mut h);
    }
    Ok(h.finish())
}

pub fn load(dir: &Path) -> std::io::Result<Loaded> {
    let mut out = Loaded::default();
    let mut pools = Vec::new();
    for file in files(dir)? {
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                out.errors
                    .push(format!("{}: cannot read: {e}", file.display()));
                continue;
            }
        };
        // serde_yaml's document iterator yields errors forever after a syntax error: stop at
        // the first document that fails to parse.
        for (n, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let at = format!("{}#{}", file.display(), n + 1);
            let value = match serde_yaml::Value::deserialize(doc) {
                Ok(serde_yaml::Value::Null) => continue,
                Ok(v) => v,
                Err(e) => {
                    out.errors.push(format!("{at}: not YAML: {e}"));
                    break;
                }
            };
            let object: Object = match serde_yaml::from_value(value) {
                Ok(o) => o,
                Err(e) => {
                    out.errors.push(format!(
                        "{at}: not an allot object (apiVersion, kind, metadata, spec): {e}"
                    ));
                    continue;
                }
            };
            if object.api_version != API_VERSION {
                out.errors.push(format!(
                    "{at}: {} {}: apiVersion {} is not {API_VERSION}",
                    object.kind, object.metadata.name, object.api_version
                ));
                continue;
            }
            let name = object.metadata.name.clone();
            let result = match object.kind.as_str() {
                "IPPool" => serde_yaml::from_value::<IpPoolSpec>(object.spec)
                    .map_err(|e| format!("IPPool {name}: spec: {e}"))
                    .and_then(|spec| {
                        Pool::from_spec(object.metadata, spec).map_err(|e| e.to_string())
                    })
                    .map(|p| pools.push(p)),
                "Subnet" => serde_yaml::from_value::<SubnetSpec>(object.spec)
                    .map_err(|e| format!("Subnet {name}: spec: {e}"))
                    .and_then(|spec| {
                        Subnet::from_spec(object.metadata, spec).map_err(|e| e.to_string())
                    })
                    .map(|s| out.subnets.push(s)),
                "ReservedIP" => serde_yaml::from_value::<ReservedIpSpec>(object.spec)
                    .map_err(|e| format!("ReservedIP {name}: spec: {e}"))
                    .and_then(|spec| {
                        Reserved::from_spec(object.metadata, spec).map_err(|e| e.to_string())
                    })
                    .map(|r| out.reserved.push(r)),
                other => Err(format!("kind {other} is not IPPool, Subnet or ReservedIP")),
            };
            if let Err(e) = result {
                out.errors.push(format!("{at}: {e}"));
            }
        }
    }
    let (pools, errors) = check_pools(pools);
    out.pools = pools;
    out.errors.extend(errors.into_iter().map(|e| e.to_string()));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_objects_are_reported_and_valid_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("pools.yaml"),
            r#"
apiVersion: allot.dev/v1alpha1
kind: IPPool
metadata: {name: good}
spec: {subnet: 10.6.0.0/24, ips: ["10.6.0.10-10.6.0.20"], gateway: 10.6.0.1}
---
apiVersion: allot.dev/v1alpha1
kind: IPPool
metadata: {name: gateway-outside}
spec: {subnet: 10.7.0.0/24, gateway: 10.8.0.1}
---
apiVersion: allot.dev/v1alpha1
kind: IPPool
metadata: {name: reversed}
spec: {subnet: 10.9.0.0/24, ips: ["10.9.0.20-10.9.0.10"]}
---
apiVersion: allot.dev/v1alpha1
kind: IPPool
metadata: {name: overlapping}
spec: {subnet: 10.6.0.0/24, ips: ["10.6.0.15"]}
---
apiVersion: allot.dev/v1alpha1
kind: IPPool
metadata: {name: typo}
spec: {subnet: 10.5.0.0/24, nodename: [n1]}
---
apiVersion: allot.dev/v1alpha1
kind: ReservedIP
metadata: {name: routers}
spec: {ips: ["10.6.0.10"]}
"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("broken.yaml"), "kind: [\n").unwrap();
        std::fs::write(dir.path().join("ignored.txt"), "not yaml").unwrap();
        let loaded = load(dir.path()).unwrap();
        let names: Vec<&str> = loaded.pools.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["good"]);
        assert_eq!(loaded.reserved.len(), 1);
        let errors = loaded.errors.join("\n");
        assert_eq!(loaded.errors.len(), 5, "{errors}");
        for needle in [
            "broken.yaml#1: not YAML",
            "gateway 10.8.0.1 lies outside subnet 10.7.0.0/24",
            "range `10.9.0.20-10.9.0.10` ends before it starts",
            "IPPool overlapping: addresses 10.6.0.15 are also in IPPool good",
            "unknown field `nodename`",
        ] {
            assert!(errors.contains(needle), "missing {needle:?} in:\n{errors}");
        }
    }

    #[test]
    fn the_fingerprint_changes_with_content() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p.yaml");
        std::fs::write(&f, "a: 1").unwrap();
        let before = fingerprint(dir.path()).unwrap();
        assert_eq!(before, fingerprint(dir.path()).unwrap());
        std::fs::write(&f, "a: 2").unwrap();
        assert_ne!(before, fingerprint(dir.path()).unwrap());
    }
}
