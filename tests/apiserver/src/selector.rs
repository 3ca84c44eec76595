//! Label and field selectors, as lists and watches take them.

use serde_json::Value;

/// `key=value`, `key==value`, `key!=value`, `key`, `!key`, `key in (a,b)`, `key notin (a,b)`,
/// joined by commas: all must hold.
#[derive(Clone, Debug, Default)]
pub struct LabelSelector(Vec<Requirement>);

#[derive(Clone, Debug)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
}

/// Splits on commas outside parentheses.
fn terms(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out.retain(|t| !t.is_empty());
    out
}

fn set(values: &str) -> Option<Vec<String>> {
    let inner = values.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_string()).collect())
}

impl LabelSelector {
    pub fn parse(s: Option<&String>) -> Result<LabelSelector, String> {
        let Some(s) = s else {
            return Ok(LabelSelector::default());
        };
        let mut out = Vec::new();
        for term in terms(s) {
            let req = if let Some((k, v)) = term.split_once("!=") {
                Requirement::NotIn(k.trim().into(), vec![v.trim().into()])
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                Requirement::In(k.trim().into(), vec![v.trim().into()])
            } else if let Some((k, v)) = term.split_once(" notin ") {
                Requirement::NotIn(
                    k.trim().into(),
                    set(v).ok_or(format!("bad set in {term:?}"))?,
                )
            } else if let Some((k, v)) = term.split_once(" in ") {
                Requirement::In(
                    k.trim().into(),
                    set(v).ok_or(format!("bad set in {term:?}"))?,
                )
            } else if let Some(k) = term.strip_prefix('!') {
                Requirement::Absent(k.trim().into())
            } else {
                Requirement::Exists(term.into())
            };
            out.push(req);
        }
        Ok(LabelSelector(out))
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => label(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::Absent(k) => label(k).is_none(),
        })
    }
}

/// `path=value`, `path==value`, `path!=value` with dotted paths (`metadata.name`,
/// `spec.nodeName`), joined by commas.
#[derive(Clone, Debug, Default)]
pub struct FieldSelector(Vec<(Vec<String>, String, bool)>);

impl FieldSelector {
    pub fn parse(s: Option<&String>) -> Result<FieldSelector, String> {
        let Some(s) = s else {
            return Ok(FieldSelector::default());
        };
        let mut out = Vec::new();
        for term in terms(s) {
            let (path, value, equal) = if let Some((k, v)) = term.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (k, v, true)
            } else {
                return Err(format!("invalid field selector term {term:?}"));
            };
            let path = path.trim().split('.').map(str::to_string).collect();
            out.push((path, value.trim().to_string(), equal));
        }
        Ok(FieldSelector(out))
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(path, value, equal)| {
            let mut v = object;
            for p in path {
                v = &v[p.as_str()];
            }
            let actual = match v {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (actual == *value) == *equal
        })
    }
}
