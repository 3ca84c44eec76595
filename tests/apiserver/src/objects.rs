//! The verbs on stored objects: get, list, create, update, patch, delete, with the API
//! server's preconditions, status subresource and finalizers.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::response::now_rfc3339;
use super::selector::{FieldSelector, LabelSelector};
use super::{Event, HISTORY, State, Target};

type Failure = (u16, String, String);

pub(crate) fn failure(code: u16, reason: &str, message: String) -> Failure {
    (code, reason.to_string(), message)
}

pub(crate) fn key(target: &Target, name: &str) -> (String, String, String) {
    (
        target.resource(),
        target.namespace.clone().unwrap_or_default(),
        name.to_string(),
    )
}

pub(crate) fn not_found(target: &Target, name: &str) -> Failure {
    failure(
        404,
        "NotFound",
        format!("{}.{} {name:?} not found", target.plural, target.group),
    )
}

pub(crate) fn get(st: &State, target: &Target) -> Result<Value, Failure> {
    let name = target.name.as_deref().unwrap_or_default();
    st.objects
        .get(&key(target, name))
        .cloned()
        .ok_or_else(|| not_found(target, name))
}

pub(crate) fn list(
    st: &State,
    target: &Target,
    query: &BTreeMap<String, String>,
) -> Result<Value, Failure> {
    let bad = |e: String| failure(400, "BadRequest", e);
    let labels = LabelSelector::parse(query.get("labelSelector")).map_err(bad)?;
    let fields = FieldSelector::parse(query.get("fieldSelector")).map_err(bad)?;
    let resource = target.resource();
    // Pages: `limit` items at a time, in key order; `continue` carries the first page's
    // resourceVersion and the last key served. (A real API server serves every page from the
    // first page's snapshot; this one serves the objects as they are now, which a client that
    // watches from the reported version cannot tell apart.)
    let limit: Option<usize> = match query.get("limit") {
        Some(l) => Some(
            l.parse()
                .map_err(|_| bad(format!("limit {l:?} is not a number")))?,
        )
        .filter(|l| *l > 0),
        None => None,
    };
    let (revision, after) = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let (rv, key) = token
                .split_once(':')
                .ok_or_else(|| bad(format!("continue token {token:?} is not this server's")))?;
            let (ns, name) = key.split_once('/').unwrap_or(("", key));
            (rv.to_string(), Some((ns.to_string(), name.to_string())))
        }
        None => (st.revision.to_string(), None),
    };
    let mut matching = st
        .objects
        .iter()
        .filter(|((r, ns, _), _)| {
            *r == resource && target.namespace.as_ref().is_none_or(|n| n == ns)
        })
        .filter(|((_, ns, name), _)| {
            after
                .as_ref()
                .is_none_or(|(a_ns, a_name)| (ns, name) > (a_ns, a_name))
        })
        .filter(|(_, o)| labels.matches(o) && fields.matches(o));
    let mut items = Vec::new();
    let mut next = None;
    for ((_, ns, name), o) in matching.by_ref() {
        if limit.is_some_and(|l| items.len() == l) {
            next = Some(format!("{revision}:{}", items_last_key(&items)));
            break;
        }
        items.push((format!("{ns}/{name}"), o.clone()));
    }
    let items: Vec<Value> = items.into_iter().map(|(_, o)| o).collect();
    let kind = items
        .first()
        .and_then(|o| o["kind"].as_str())
        .map(|k| format!("{k}List"))
        .unwrap_or_else(|| "List".to_string());
    let api_version = if target.group.is_empty() {
        target.version.clone()
    } else {
        format!("{}/{}", target.group, target.version)
    };
    Ok(json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": match next {
            Some(token) => json!({"resourceVersion": revision, "continue": token}),
            None => json!({"resourceVersion": revision}),
        },
        "items": items,
    }))
}

fn items_last_key(items: &[(String, Value)]) -> &str {
    items.last().map(|(k, _)| k.as_str()).unwrap_or_default()
}

impl State {
    pub(crate) fn record(&mut self, target: &Target, kind: &'static str, object: &Value) {
        self.history.push_back(Arc::new(Event {
            revision: self.revision,
            resource: target.resource(),
            namespace: target.namespace.clone().unwrap_or_default(),
            kind,
            object: object.clone(),
        }));
        while self.history.len() > HISTORY {
            let old = self.history.pop_front().expect("non-empty");
            self.compacted = old.revision;
        }
    }

    pub(crate) fn bump(&mut self, object: &mut Value) {
        self.revision += 1;
        object["metadata"]["resourceVersion"] = json!(self.revision.to_string());
    }
}

pub(crate) fn create(st: &mut State, target: &Target, mut object: Value) -> Result<Value, Failure> {
    if !object.is_object() || !object["metadata"].is_object() {
        return Err(failure(
            400,
            "BadRequest",
            "the object has no metadata".into(),
        ));
    }
    let name = match object["metadata"]["name"].as_str() {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => match object["metadata"]["generateName"].as_str() {
            Some(prefix) => {
                st.next_uid += 1;
                format!("{prefix}{:05x}", st.next_uid)
            }
            None => {
                return Err(failure(
                    422,
                    "Invalid",
                    "metadata.name: Required value".into(),
                ));
            }
        },
    };
    let k = key(target, &name);
    if st.objects.contains_key(&k) {
        return Err(failure(
            409,
            "AlreadyExists",
            format!("{}.{} {name:?} already exists", target.plural, target.group),
        ));
    }
    st.next_uid += 1;
    let meta = object["metadata"].as_object_mut().expect("checked above");
    meta.insert("name".into(), json!(name));
    if let Some(ns) = &target.namespace {
        meta.insert("namespace".into(), json!(ns));
    }
    meta.insert(
        "uid".into(),
        json!(format!("00000000-0000-4000-8000-{:012x}", st.next_uid)),
    );
    meta.entry("creationTimestamp")
        .or_insert_with(|| json!(now_rfc3339()));
    meta.insert("generation".into(), json!(1));
    meta.remove("resourceVersion");
    st.bump(&mut object);
    st.record(target, "ADDED", &object);
    st.objects.insert(k, object.clone());
    Ok(object)
}

/// Checks a `resourceVersion` precondition (absent or empty: none).
pub(crate) fn precondition(stored: &Value, wanted: &Value, target: &Target) -> Result<(), Failure> {
    match wanted.as_str() {
        Some(rv)
            if !rv.is_empty() && Some(rv) != stored["metadata"]["resourceVersion"].as_str() =>
        {
            Err(failure(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {}.{} {:?}: the object has been modified; \
                     please apply your changes to the latest version and try again",
                    target.plural,
                    target.group,
                    stored["metadata"]["name"].as_str().unwrap_or_default()
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// Writes `next` over `stored` (the status subresource writes only the status; the main
/// resource keeps the stored status), as one new version.
pub(crate) fn write(
    st: &mut State,
    target: &Target,
    stored: &Value,
    next: Value,
) -> Result<Value, Failure> {
    let mut object = if target.subresource.as_deref() == Some("status") {
        let mut o = stored.clone();
        o["status"] = next["status"].clone();
        o
    } else {
        let mut o = next;
        match stored.get("status") {
            Some(s) => o["status"] = s.clone(),
            None => {
                if let Some(m) = o.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        o
    };
    // What the server owns stays the server's.
    for field in [
        "uid",
        "creationTimestamp",
        "namespace",
        "name",
        "deletionTimestamp",
    ] {
        match stored["metadata"].get(field) {
            Some(v) => object["metadata"][field] = v.clone(),
            None => {
                if let Some(m) = object["metadata"].as_object_mut() {
                    m.remove(field);
                }
            }
        }
    }
    let generation = stored["metadata"]["generation"].as_u64().unwrap_or(1);
    let spec_changed = object.get("spec") != stored.get("spec");
    object["metadata"]["generation"] = json!(generation + u64::from(spec_changed));
    if object == *stored {
        // Nothing changed: the API server writes nothing and keeps the version.
        return Ok(object);
    }
    let name = stored["metadata"]["name"].as_str().unwrap_or_default();
    let k = key(target, name);
    let finalized = object["metadata"]["deletionTimestamp"].is_string()
        && object["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty());
    st.bump(&mut object);
    if finalized {
        st.record(target, "DELETED", &object);
        st.objects.remove(&k);
    } else {
        st.record(target, "MODIFIED", &object);
        st.objects.insert(k, object.clone());
    }
    Ok(object)
}

pub(crate) fn update(st: &mut State, target: &Target, object: Value) -> Result<Value, Failure> {
    let stored = get(st, target)?;
    precondition(&stored, &object["metadata"]["resourceVersion"], target)?;
    write(st, target, &stored, object)
}

pub(crate) fn patch(
    st: &mut State,
    target: &Target,
    patch: Value,
    apply: bool,
) -> Result<Value, Failure> {
    let stored = match get(st, target) {
        Ok(s) => s,
        Err(_) if apply => {
            let mut fresh = patch;
            fresh["metadata"]["name"] = json!(target.name.clone().unwrap_or_default());
            return create(st, target, fresh);
        }
        Err(e) => return Err(e),
    };
    precondition(&stored, &patch["metadata"]["resourceVersion"], target)?;
    let mut next = stored.clone();
    merge(&mut next, &patch);
    // `write` keeps the stored status for the main resource and takes only the status for the
    // status subresource: what a patch of either may change.
    write(st, target, &stored, next)
}

/// RFC 7386 JSON merge patch.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("made an object above");
    for (k, v) in patch {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

pub(crate) fn delete(st: &mut State, target: &Target, options: Value) -> Result<Value, Failure> {
    let stored = get(st, target)?;
    let pre = &options["preconditions"];
    precondition(&stored, &pre["resourceVersion"], target)?;
    if let Some(uid) = pre["uid"].as_str()
        && Some(uid) != stored["metadata"]["uid"].as_str()
    {
        return Err(failure(
            409,
            "Conflict",
            format!("Precondition failed: UID in precondition: {uid}"),
        ));
    }
    let name = stored["metadata"]["name"].as_str().unwrap_or_default();
    let k = key(target, name);
    let finalizers = stored["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty());
    let mut object = stored.clone();
    if finalizers {
        if object["metadata"]["deletionTimestamp"].is_string() {
            return Ok(object);
        }
        object["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
        st.bump(&mut object);
        st.record(target, "MODIFIED", &object);
        st.objects.insert(k, object.clone());
        return Ok(object);
    }
    st.bump(&mut object);
    st.record(target, "DELETED", &object);
    st.objects.remove(&k);
    Ok(object)
}

// ---------------------------------------------------------------------------------------------
