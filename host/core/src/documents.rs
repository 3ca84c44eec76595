//! allot objects (IPPool, Subnet, ReservedIP) from YAML or JSON documents, each checked on its
//! own: the one validation that the standalone directory, `allotctl pool apply` and the etcd
//! configuration keys share.

use serde::Deserialize;

use crate::config::{Invalid, Object, ObjectKind, Observation, Observed};
use crate::spec::{IpPoolSpec, ObjectMeta, ReservedIpSpec, SubnetSpec};
use crate::{Pool, Reserved, Subnet};

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

/// Observes every document of `text` (one source: a file, an etcd key) into `out`. A document
/// that is not YAML or not recognisably an allot object marks the source incomplete.
pub fn observe_text(text: &str, source: &str, out: &mut Observation) {
    // serde_yaml's document iterator yields errors forever after a syntax error: stop at the
    // first document that fails to parse.
    for (n, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let at = format!("{source}#{}", n + 1);
        let value = match serde_yaml::Value::deserialize(doc) {
            Ok(serde_yaml::Value::Null) => continue,
            Ok(v) => v,
            Err(e) => {
                out.incomplete
                    .insert(source.to_string(), format!("{at}: not YAML: {e}"));
                break;
            }
        };
        match observe(value, source, &at) {
            Ok(observed) => out.objects.push(observed),
            Err(why) => {
                out.incomplete
                    .entry(source.to_string())
                    .or_insert_with(|| why.to_string());
            }
        }
    }
}

/// Why a document is not recognisably an allot object (which marks its source incomplete);
/// each names the document (`at`). An object that is recognisably one but fails its checks is
/// observed, invalid: [`Observed::object`].
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("{at}: not an allot object (apiVersion, kind, metadata, spec): {source}")]
    NotAnObject {
        at: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("{at}: kind {kind} is not IPPool, Subnet or ReservedIP")]
    UnknownKind { at: String, kind: String },
    #[error("{at}: {kind} without metadata.name")]
    NoName { at: String, kind: ObjectKind },
}

/// One document as an observed object, or why it is not recognisably one.
pub fn observe(
    value: serde_yaml::Value,
    source: &str,
    at: &str,
) -> Result<Observed, DocumentError> {
    let header: Header =
        serde_yaml::from_value(value).map_err(|source| DocumentError::NotAnObject {
            at: at.to_string(),
            source,
        })?;
    let kind = match header.kind.as_str() {
        "IPPool" => ObjectKind::IpPool,
        "Subnet" => ObjectKind::Subnet,
        "ReservedIP" => ObjectKind::ReservedIp,
        other => {
            return Err(DocumentError::UnknownKind {
                at: at.to_string(),
                kind: other.to_string(),
            });
        }
    };
    let name = header.metadata.name.clone();
    if name.is_empty() {
        return Err(DocumentError::NoName {
            at: at.to_string(),
            kind,
        });
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
                .map(|s| Object::Subnet(Box::new(s)))
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

/// Checks `applied` (objects about to be written over `current`) exactly as an agent would
/// reconcile the result, and refuses an edit that would orphan a claimed address (a claim of
/// pool P whose address the new P no longer holds). Returns every reason to refuse.
pub fn check_apply(
    current: &Observation,
    applied: &Observation,
    claims: &[crate::store::Claim],
) -> Result<(), Vec<String>> {
    use std::collections::BTreeSet;
    let mut refused: Vec<String> = applied
        .incomplete
        .values()
        .cloned()
        .chain(applied.objects.iter().filter_map(|o| match &o.object {
            Err(invalid) => Some(format!("{}: {}", o.at, invalid.error)),
            Ok(_) => None,
        }))
        .collect();
    if !refused.is_empty() {
        return Err(refused);
    }
    let replaced: BTreeSet<(ObjectKind, &str)> = applied
        .objects
        .iter()
        .map(|o| (o.kind, o.name.as_str()))
        .collect();
    let mut merged = Observation {
        objects: current
            .objects
            .iter()
            .filter(|o| !replaced.contains(&(o.kind, o.name.as_str())))
            .cloned()
            .collect(),
        incomplete: current.incomplete.clone(),
    };
    merged.objects.extend(applied.objects.iter().cloned());
    let serving: BTreeSet<&str> = claims.iter().map(|c| c.pool.as_str()).collect();
    let reconciled =
        crate::config::reconcile(&Default::default(), &merged, &|p| serving.contains(p));
    for p in &reconciled.problems {
        if replaced.contains(&(p.kind, p.name.as_str())) {
            refused.push(p.to_string());
        }
    }
    for o in applied
        .objects
        .iter()
        .filter(|o| o.kind == ObjectKind::IpPool)
    {
        let Some((pool, _)) = reconciled.in_force.pools.get(&o.name) else {
            continue;
        };
        let holds = pool.assignable(&crate::AddrSet::empty(pool.family));
        let orphaned: Vec<String> = claims
            .iter()
            .filter(|c| c.pool == o.name && !holds.contains(c.address))
            .map(|c| c.address.to_string())
            .collect();
        if !orphaned.is_empty() {
            refused.push(format!(
                "{}: IPPool {} would no longer hold claimed address(es) {}: release them first \
                 (or keep them in the pool)",
                o.at,
                o.name,
                orphaned.join(", ")
            ));
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Claim, PodRef};

    fn observe_all(text: &str, source: &str) -> Observation {
        let mut out = Observation::default();
        observe_text(text, source, &mut out);
        out
    }

    fn pool(name: &str, subnet: &str, ips: &str) -> String {
        format!(
            "apiVersion: allot.dev/v1alpha1\nkind: IPPool\nmetadata: {{name: {name}}}\nspec: {{subnet: {subnet}, ips: [\"{ips}\"]}}\n"
        )
    }

    fn claim(address: &str, pool: &str) -> Claim {
        Claim {
            address: address.parse().unwrap(),
            pool: pool.into(),
            network: "n".into(),
            attachment: None,
            pod: PodRef::default(),
            node: String::new(),
            updated_at: 0,
        }
    }

    #[test]
    fn an_apply_is_refused_for_what_an_agent_would_refuse() {
        let current = observe_all(&pool("a", "10.1.0.0/24", "10.1.0.10-10.1.0.20"), "etcd:a");
        // Invalid.
        let bad = observe_all(&pool("b", "10.2.0.0/24", "10.3.0.1"), "file#1");
        let err = check_apply(&current, &bad, &[]).unwrap_err().join("\n");
        assert!(err.contains("10.3.0.1"), "{err}");
        // Not YAML.
        let broken = observe_all("kind: [\n", "file");
        assert!(check_apply(&current, &broken, &[]).is_err());
        // Overlapping a pool that serves claims, whatever the names.
        let overlap = observe_all(&pool("0-first", "10.1.0.0/24", "10.1.0.15"), "file#1");
        let err = check_apply(&current, &overlap, &[claim("10.1.0.11", "a")])
            .unwrap_err()
            .join("\n");
        assert!(err.contains("0-first"), "{err}");
        // A disjoint new pool is fine.
        let fine = observe_all(&pool("c", "10.4.0.0/24", "10.4.0.1-10.4.0.9"), "file#1");
        assert_eq!(
            check_apply(&current, &fine, &[claim("10.1.0.11", "a")]),
            Ok(())
        );
    }

    #[test]
    fn an_edit_that_would_orphan_a_claim_is_refused() {
        let current = observe_all(&pool("a", "10.1.0.0/24", "10.1.0.10-10.1.0.20"), "etcd:a");
        let shrunk = observe_all(&pool("a", "10.1.0.0/24", "10.1.0.10-10.1.0.12"), "file#1");
        let claims = [claim("10.1.0.11", "a"), claim("10.1.0.15", "a")];
        let err = check_apply(&current, &shrunk, &claims)
            .unwrap_err()
            .join("\n");
        assert!(
            err.contains("would no longer hold claimed address(es) 10.1.0.15"),
            "{err}"
        );
        assert!(!err.contains("10.1.0.11"), "{err}");
        let grown = observe_all(&pool("a", "10.1.0.0/24", "10.1.0.10-10.1.0.30"), "file#1");
        assert_eq!(check_apply(&current, &grown, &claims), Ok(()));
    }
}
