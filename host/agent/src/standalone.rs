//! Standalone mode's inventory: IPPool, Subnet and ReservedIP objects from the YAML files of a
//! directory, each checked on its own. What stays in force when some are invalid (the previous
//! version, never more free addresses) is core's [`reconcile`](allot_core::config::reconcile).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use allot_core::config::{Invalid, Object, ObjectKind, Observation, Observed};
use allot_core::spec::{IpPoolSpec, ObjectMeta, ReservedIpSpec, SubnetSpec};
use allot_core::{Pool, Reserved, Subnet};
use serde::Deserialize;

pub const API_VERSION: &str = "allot.dev/v1alpha1";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: serde_yaml::Value,
    /// Status is derived by allot; a copy in the files is ignored.
    #[serde(default)]
    #[allow(dead_code)]
    status: serde_yaml::Value,
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

/// Reads every object of `dir`. A file that cannot be read, or holds a document that is not
/// YAML or not recognisably an allot object (a file half-written by an editor), is marked
/// incomplete: the objects it held before stay in force.
pub fn load(dir: &Path) -> std::io::Result<Observation> {
    let mut out = Observation::default();
    for file in files(dir)? {
        let source = file.display().to_string();
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                out.incomplete.insert(source, format!("cannot read: {e}"));
                continue;
            }
        };
        // serde_yaml's document iterator yields errors forever after a syntax error: stop at
        // the first document that fails to parse.
        for (n, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let at = format!("{source}#{}", n + 1);
            let value = match serde_yaml::Value::deserialize(doc) {
                Ok(serde_yaml::Value::Null) => continue,
                Ok(v) => v,
                Err(e) => {
                    out.incomplete
                        .insert(source.clone(), format!("{at}: not YAML: {e}"));
                    break;
                }
            };
            match observe(value, &source, &at) {
                Ok(observed) => out.objects.push(observed),
                Err(why) => {
                    out.incomplete.entry(source.clone()).or_insert(why);
                }
            }
        }
    }
    Ok(out)
}

/// One document as an observed object, or why it is not recognisably one.
fn observe(value: serde_yaml::Value, source: &str, at: &str) -> Result<Observed, String> {
    let header: Header = serde_yaml::from_value(value).map_err(|e| {
        format!("{at}: not an allot object (apiVersion, kind, metadata, spec): {e}")
    })?;
    let kind = match header.kind.as_str() {
        "IPPool" => ObjectKind::IpPool,
        "Subnet" => ObjectKind::Subnet,
        "ReservedIP" => ObjectKind::ReservedIp,
        other => {
            return Err(format!(
                "{at}: kind {other} is not IPPool, Subnet or ReservedIP"
            ));
        }
    };
    let name = header.metadata.name.clone();
    if name.is_empty() {
        return Err(format!("{at}: {kind} without metadata.name"));
    }
    let object = if header.api_version != API_VERSION {
        Err(Invalid {
            error: format!("apiVersion {} is not {API_VERSION}", header.api_version),
            salvaged: None,
        })
    } else {
        check(kind, header.metadata, header.spec)
    };
    Ok(Observed {
        kind,
        name,
        source: source.to_string(),
        at: at.to_string(),
        object,
    })
}

fn check(kind: ObjectKind, meta: ObjectMeta, spec: serde_yaml::Value) -> Result<Object, Invalid> {
    let name = meta.name.clone();
    let invalid = |error: String| Invalid {
        error,
        salvaged: None,
    };
    match kind {
        ObjectKind::IpPool => {
            let spec: IpPoolSpec = serde_yaml::from_value(spec)
                .map_err(|e| invalid(format!("IPPool {name}: spec: {e}")))?;
            Pool::from_spec(meta, spec)
                .map(|p| Object::Pool(Box::new(p)))
                .map_err(|e| invalid(e.to_string()))
        }
        ObjectKind::Subnet => {
            let spec: SubnetSpec = serde_yaml::from_value(spec)
                .map_err(|e| invalid(format!("Subnet {name}: spec: {e}")))?;
            Subnet::from_spec(meta, spec)
                .map(Object::Subnet)
                .map_err(|e| invalid(e.to_string()))
        }
        ObjectKind::ReservedIp => {
            let lenient = lenient_reserved_spec(&spec);
            let result = serde_yaml::from_value::<ReservedIpSpec>(spec)
                .map_err(|e| format!("ReservedIP {name}: spec: {e}"))
                .and_then(|spec| {
                    Reserved::from_spec(meta.clone(), spec).map_err(|e| e.to_string())
                });
            result.map(Object::Reserved).map_err(|error| Invalid {
                error,
                // Whatever entries parse stay reserved: leaving them out would free them.
                salvaged: Reserved::salvage(meta, &lenient).map(|(r, _)| Box::new(r)),
            })
        }
    }
}

/// The parts of a ReservedIP spec that can be read even when the spec as a whole is invalid
/// (an unknown field, a number among the `ips`).
fn lenient_reserved_spec(spec: &serde_yaml::Value) -> ReservedIpSpec {
    let ip_version = spec
        .get("ipVersion")
        .and_then(|v| v.as_u64())
        .and_then(|v| u8::try_from(v).ok());
    let ips = spec
        .get("ips")
        .and_then(|v| v.as_sequence())
        .map(|seq| {
            seq.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    ReservedIpSpec { ip_version, ips }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_core::config::{ProblemState, reconcile};

    #[test]
    fn objects_are_observed_one_by_one_and_bad_documents_mark_their_file() {
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
spec: {ips: ["10.6.0.10", "10.6.0.11", "10.6.0.300"]}
"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("broken.yaml"), "kind: [\n").unwrap();
        std::fs::write(dir.path().join("ignored.txt"), "not yaml").unwrap();
        let observation = load(dir.path()).unwrap();
        assert_eq!(observation.objects.len(), 6);
        let broken = dir.path().join("broken.yaml").display().to_string();
        assert!(
            observation.incomplete[&broken].contains("not YAML"),
            "{:?}",
            observation.incomplete
        );

        let reconciled = reconcile(&Default::default(), &observation, &|_| false);
        let pools: Vec<String> = reconciled.in_force.pools.keys().cloned().collect();
        assert_eq!(pools, ["good"]);
        let problems: Vec<String> = reconciled.problems.iter().map(|p| p.to_string()).collect();
        let problems = problems.join("\n");
        for needle in [
            "gateway 10.8.0.1 lies outside subnet 10.7.0.0/24",
            "range `10.9.0.20-10.9.0.10` ends before it starts",
            "addresses 10.6.0.15 are also in IPPool good",
            "unknown field `nodename`",
            "10.6.0.300",
        ] {
            assert!(
                problems.contains(needle),
                "missing {needle:?} in:\n{problems}"
            );
        }
        // The malformed ReservedIP still reserves the entries it could read (first load).
        let routers = &reconciled.in_force.reserved["routers"].0;
        assert_eq!(routers.ips.to_entries(), ["10.6.0.10-10.6.0.11"]);
        let partial = reconciled
            .problems
            .iter()
            .find(|p| p.name == "routers")
            .unwrap();
        assert_eq!(partial.state, ProblemState::Partial);
    }

    #[test]
    fn a_reserved_ip_with_a_bad_field_salvages_its_strings() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("r.yaml"),
            "apiVersion: allot.dev/v1alpha1\nkind: ReservedIP\nmetadata: {name: r}\nspec: {ips: [\"10.1.0.5\", 7], colour: red}\n",
        )
        .unwrap();
        let observation = load(dir.path()).unwrap();
        let Err(invalid) = &observation.objects[0].object else {
            panic!("a bad field makes the object invalid");
        };
        let salvaged = invalid.salvaged.as_ref().expect("salvaged");
        assert_eq!(salvaged.ips.to_entries(), ["10.1.0.5"]);
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
