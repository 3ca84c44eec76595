//! The annotation vocabulary users know from Spiderpool, under allot's prefix and Spiderpool's,
//! parsed with errors that name the key and the problem.
//!
//! When both prefixes carry the same annotation, `ipam.allot.dev/` wins.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::types::{DecisionError, Label, Route};

pub const ALLOT_PREFIX: &str = "ipam.allot.dev/";
pub const SPIDERPOOL_PREFIX: &str = "ipam.spidernet.io/";

/// Annotation names (without prefix).
pub const IPPOOL: &str = "ippool";
pub const IPPOOLS: &str = "ippools";
pub const SUBNET: &str = "subnet";
pub const SUBNETS: &str = "subnets";
pub const ROUTES: &str = "routes";
pub const NS_DEFAULT_V4: &str = "default-ipv4-ippool";
pub const NS_DEFAULT_V6: &str = "default-ipv6-ippool";
/// Older Spiderpool spellings of the namespace defaults.
pub const NS_DEFAULT_V4_OLD: &str = "defaultv4ippool";
pub const NS_DEFAULT_V6_OLD: &str = "defaultv6ippool";

/// An annotation found under one of the prefixes: the full key (for messages) and the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found<'a> {
    pub key: &'a str,
    pub value: &'a str,
}

/// Finds annotation `name` under `ipam.allot.dev/` or `ipam.spidernet.io/`.
pub fn find<'a>(annotations: &'a [Label], name: &str) -> Option<Found<'a>> {
    let under = |prefix: &str| {
        annotations.iter().find(|l| {
            l.key.len() == prefix.len() + name.len()
                && l.key.starts_with(prefix)
                && l.key.ends_with(name)
        })
    };
    under(ALLOT_PREFIX)
        .or_else(|| under(SPIDERPOOL_PREFIX))
        .map(|l| Found {
            key: &l.key,
            value: &l.value,
        })
}

pub(crate) fn malformed(
    key: &str,
    problem: impl std::fmt::Display,
    example: &str,
) -> DecisionError {
    DecisionError::invalid_input(format!(
        "annotation {key} is malformed: {problem}; expected a value like {example}"
    ))
}

pub(crate) fn parse_json<T: DeserializeOwned>(
    found: Found,
    example: &str,
) -> Result<T, DecisionError> {
    serde_json::from_str(found.value).map_err(|e| malformed(found.key, e, example))
}

/// serde reads a struct from a JSON array too (fields by position), so a value like
/// `["eth0",["pool-a"]]` would pass for `{"interface":"eth0","ipv4":["pool-a"]}`: require objects.
fn require_object(
    key: &str,
    value: &serde_json::Value,
    example: &str,
) -> Result<(), DecisionError> {
    if value.is_object() {
        Ok(())
    } else {
        Err(malformed(
            key,
            format_args!("expected a JSON object, found {}", json_kind(value)),
            example,
        ))
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Parses a JSON object, or a list of JSON objects, into `T`.
pub(crate) fn parse_objects<T: DeserializeOwned>(
    found: Found,
    example: &str,
    list: bool,
) -> Result<T, DecisionError> {
    let value: serde_json::Value = parse_json(found, example)?;
    if list {
        match &value {
            serde_json::Value::Array(items) => {
                for item in items {
                    require_object(found.key, item, example)?;
                }
            }
            other => {
                return Err(malformed(
                    found.key,
                    format_args!(
                        "expected a JSON array of objects, found {}",
                        json_kind(other)
                    ),
                    example,
                ));
            }
        }
    } else {
        require_object(found.key, &value, example)?;
    }
    serde_json::from_value(value).map_err(|e| malformed(found.key, e, example))
}

/// The value of `ippool` / `subnet`, or one entry of `ippools` / `subnets`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    #[serde(default)]
    pub interface: Option<String>,
    #[serde(default)]
    pub ipv4: Vec<String>,
    #[serde(default)]
    pub ipv6: Vec<String>,
    #[serde(default, alias = "cleanGateway")]
    pub cleangateway: bool,
}

impl Selection {
    pub fn is_empty(&self) -> bool {
        self.ipv4.is_empty() && self.ipv6.is_empty()
    }
}

const SELECTION_EXAMPLE: &str = r#"{"ipv4":["pool-v4"],"ipv6":["pool-v6"]}"#;
const SELECTIONS_EXAMPLE: &str =
    r#"[{"interface":"eth0","ipv4":["pool-a"]},{"interface":"net1","ipv4":["pool-b"]}]"#;

fn check_names(key: &str, sel: &Selection, example: &str) -> Result<(), DecisionError> {
    if sel.is_empty() {
        return Err(malformed(
            key,
            "neither ipv4 nor ipv6 lists a name",
            example,
        ));
    }
    if sel
        .ipv4
        .iter()
        .chain(&sel.ipv6)
        .any(|n| n.trim().is_empty())
    {
        return Err(malformed(key, "a name is empty", example));
    }
    if sel
        .interface
        .as_deref()
        .is_some_and(|i| i.trim().is_empty())
    {
        return Err(malformed(key, "interface is empty", example));
    }
    Ok(())
}

/// Parses a single selection (`ippool`, `subnet`).
pub fn selection(found: Found) -> Result<Selection, DecisionError> {
    let sel: Selection = parse_objects(found, SELECTION_EXAMPLE, false)?;
    check_names(found.key, &sel, SELECTION_EXAMPLE)?;
    Ok(sel)
}

/// Parses a per-interface list (`ippools`, `subnets`): interface names are all given or all
/// omitted, and never repeated.
pub fn selections(found: Found) -> Result<Vec<Selection>, DecisionError> {
    let list: Vec<Selection> = parse_objects(found, SELECTIONS_EXAMPLE, true)?;
    if list.is_empty() {
        return Err(malformed(
            found.key,
            "the list is empty",
            SELECTIONS_EXAMPLE,
        ));
    }
    for sel in &list {
        check_names(found.key, sel, SELECTIONS_EXAMPLE)?;
    }
    let named = list.iter().filter(|s| s.interface.is_some()).count();
    if named != 0 && named != list.len() {
        return Err(malformed(
            found.key,
            "give an interface for every entry or for none",
            SELECTIONS_EXAMPLE,
        ));
    }
    for (i, sel) in list.iter().enumerate() {
        if let Some(name) = &sel.interface
            && list[..i].iter().any(|s| s.interface.as_ref() == Some(name))
        {
            return Err(malformed(
                found.key,
                format_args!("interface {name} appears twice"),
                SELECTIONS_EXAMPLE,
            ));
        }
    }
    Ok(list)
}

/// Parses a namespace default list: `["pool-a","pool-b"]`.
pub fn name_list(found: Found) -> Result<Vec<String>, DecisionError> {
    const EXAMPLE: &str = r#"["ns-pool1","ns-pool2"]"#;
    let names: Vec<String> = parse_json(found, EXAMPLE)?;
    if names.iter().any(|n| n.trim().is_empty()) {
        return Err(malformed(found.key, "a name is empty", EXAMPLE));
    }
    Ok(names)
}

/// Parses the `routes` annotation: `[{"dst":"10.0.0.0/16","gw":"192.168.1.1"}]`.
pub fn routes(found: Found) -> Result<Vec<Route>, DecisionError> {
    const EXAMPLE: &str = r#"[{"dst":"10.0.0.0/16","gw":"192.168.1.1"}]"#;
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct R {
        dst: String,
        gw: String,
    }
    let list: Vec<R> = parse_objects(found, EXAMPLE, true)?;
    list.into_iter()
        .map(|r| {
            let gw: std::net::IpAddr = r.gw.parse().map_err(|_| {
                malformed(
                    found.key,
                    format_args!("gw {:?} is not an address", r.gw),
                    EXAMPLE,
                )
            })?;
            let dst_ok = r.dst.split_once('/').is_some_and(|(addr, len)| {
                // Digits without a leading zero: `u8::from_str` would also take "+16" and
                // "016", which the host's CIDR parser refuses (it would drop the route).
                let plain = !len.is_empty()
                    && len.bytes().all(|b| b.is_ascii_digit())
                    && (len == "0" || !len.starts_with('0'));
                match (addr.parse::<std::net::IpAddr>(), len.parse::<u8>()) {
                    (Ok(_), Ok(_)) if !plain => false,
                    (Ok(a), Ok(l)) => {
                        l <= if a.is_ipv4() { 32 } else { 128 } && a.is_ipv4() == gw.is_ipv4()
                    }
                    _ => false,
                }
            });
            if !dst_ok {
                return Err(malformed(
                    found.key,
                    format_args!(
                        "dst {:?} is not a CIDR of the same family as gw {}",
                        r.dst, r.gw
                    ),
                    EXAMPLE,
                ));
            }
            Ok(Route {
                dst: r.dst,
                gw: r.gw,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anns(pairs: &[(&str, &str)]) -> Vec<Label> {
        pairs
            .iter()
            .map(|(k, v)| Label {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect()
    }

    #[test]
    fn allot_prefix_wins_over_spiderpool() {
        let a = anns(&[
            ("ipam.spidernet.io/ippool", r#"{"ipv4":["s"]}"#),
            ("ipam.allot.dev/ippool", r#"{"ipv4":["a"]}"#),
        ]);
        let found = find(&a, IPPOOL).unwrap();
        assert_eq!(found.key, "ipam.allot.dev/ippool");
        assert_eq!(
            find(&a[..1], IPPOOL).unwrap().key,
            "ipam.spidernet.io/ippool"
        );
        assert!(
            find(&a, IPPOOLS).is_none(),
            "ippool is not a prefix match for ippools"
        );
    }

    #[test]
    fn malformed_values_name_the_key_and_the_problem() {
        let a = anns(&[("ipam.allot.dev/ippool", r#"{"ipv4":"a"}"#)]);
        let err = selection(find(&a, IPPOOL).unwrap()).unwrap_err();
        assert!(
            err.message
                .contains("annotation ipam.allot.dev/ippool is malformed"),
            "{}",
            err.message
        );
        assert!(err.message.contains("invalid type"), "{}", err.message);

        let a = anns(&[("ipam.allot.dev/ippool", r#"{"ipv5":["a"]}"#)]);
        let err = selection(find(&a, IPPOOL).unwrap()).unwrap_err();
        assert!(
            err.message.contains("unknown field `ipv5`"),
            "{}",
            err.message
        );

        let a = anns(&[(
            "ipam.allot.dev/ippools",
            r#"[{"interface":"eth0","ipv4":["a"]},{"ipv4":["b"]}]"#,
        )]);
        let err = selections(find(&a, IPPOOLS).unwrap()).unwrap_err();
        assert!(
            err.message.contains("every entry or for none"),
            "{}",
            err.message
        );

        let a = anns(&[(
            "ipam.allot.dev/ippools",
            r#"[{"interface":"eth0","ipv4":["a"]},{"interface":"eth0","ipv4":["b"]}]"#,
        )]);
        let err = selections(find(&a, IPPOOLS).unwrap()).unwrap_err();
        assert!(
            err.message.contains("interface eth0 appears twice"),
            "{}",
            err.message
        );

        let a = anns(&[(
            "ipam.allot.dev/routes",
            r#"[{"dst":"10.0.0.0/16","gw":"fd00::1"}]"#,
        )]);
        let err = routes(find(&a, ROUTES).unwrap()).unwrap_err();
        assert!(err.message.contains("same family"), "{}", err.message);
    }

    #[test]
    fn arrays_in_place_of_objects_are_rejected() {
        let a = anns(&[("ipam.allot.dev/ippool", r#"["eth0",["pool-a"],[],true]"#)]);
        let err = selection(find(&a, IPPOOL).unwrap()).unwrap_err();
        assert!(
            err.message
                .contains("expected a JSON object, found an array"),
            "{}",
            err.message
        );
        let a = anns(&[("ipam.allot.dev/ippools", r#"[["eth0",["pool-a"]]]"#)]);
        let err = selections(find(&a, IPPOOLS).unwrap()).unwrap_err();
        assert!(
            err.message
                .contains("expected a JSON object, found an array"),
            "{}",
            err.message
        );
        let a = anns(&[("ipam.allot.dev/routes", r#"[["10.0.0.0/16","10.6.0.1"]]"#)]);
        let err = routes(find(&a, ROUTES).unwrap()).unwrap_err();
        assert!(
            err.message.contains("expected a JSON object"),
            "{}",
            err.message
        );
        let a = anns(&[(
            "ipam.allot.dev/ippools",
            r#"{"interface":"eth0","ipv4":["a"]}"#,
        )]);
        let err = selections(find(&a, IPPOOLS).unwrap()).unwrap_err();
        assert!(
            err.message
                .contains("expected a JSON array of objects, found an object"),
            "{}",
            err.message
        );
    }

    /// Found by the `annotations` fuzz target: `u8::from_str` takes "016" and "+16", which the
    /// host's CIDR parser (ipnet, in the engine) refuses, so the engine silently dropped a
    /// route the policy had accepted.
    #[test]
    fn route_prefixes_are_plain_digits() {
        for dst in [
            "10.0.0.0/016",
            "10.0.0.0/+16",
            "fd00::/+8",
            "fd00::/0008",
            "10.0.0.0/",
        ] {
            let value = format!(r#"[{{"dst":"{dst}","gw":"10.0.0.1"}}]"#);
            let a = anns(&[("ipam.allot.dev/routes", value.as_str())]);
            let err = routes(find(&a, ROUTES).unwrap()).unwrap_err();
            assert!(
                err.message.contains("is not a CIDR"),
                "{dst}: {}",
                err.message
            );
        }
        let a = anns(&[(
            "ipam.allot.dev/routes",
            r#"[{"dst":"0.0.0.0/0","gw":"10.0.0.1"},{"dst":"fd00::/128","gw":"fd00::1"}]"#,
        )]);
        assert_eq!(routes(find(&a, ROUTES).unwrap()).unwrap().len(), 2);
    }

    #[test]
    fn well_formed_values_parse() {
        let a = anns(&[(
            "ipam.spidernet.io/ippools",
            r#"[{"interface":"eth0","ipv4":["a"],"cleangateway":true},{"interface":"net1","ipv6":["b"]}]"#,
        )]);
        let list = selections(find(&a, IPPOOLS).unwrap()).unwrap();
        assert_eq!(list.len(), 2);
        assert!(list[0].cleangateway);
        assert_eq!(list[1].ipv6, vec!["b"]);
    }
}
