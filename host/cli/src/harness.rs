//! Runs scenarios against a policy and reports what differs, readably.

use std::fmt::Write as _;

use allot_core::IpFamily;
use allot_core::PolicyError;
use allot_core::policy::{
    Decision, FamilyDecision, Inventory, Policy, PoolRef, Request, describe_drop,
};

use crate::scenario::{Expect, FamilyExpect, Inputs, Loaded, NicExpect};

/// One expectation that did not hold.
#[derive(Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub what: String,
    pub expected: String,
    pub actual: String,
}

pub enum Verdict {
    Pass,
    Fail(Vec<Mismatch>),
    /// The scenario itself is broken (unparsable, invalid pools).
    Broken(String),
}

pub fn run(policy: &dyn Policy, loaded: &Loaded, generation: u64) -> Verdict {
    let scenario = match &loaded.scenario {
        Ok(s) => s,
        Err(e) => return Verdict::Broken(e.clone()),
    };
    let Inputs { inventory, request } = match scenario.inputs(generation) {
        Ok(i) => i,
        Err(e) => return Verdict::Broken(format!("invalid inventory: {e}")),
    };
    let result = policy.decide(&inventory, &request);
    let mismatches = compare(&scenario.expect, &inventory, &result);
    if mismatches.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail(mismatches)
    }
}

pub(crate) fn name(inv: &Inventory, i: u32) -> String {
    inv.pools
        .get(i as usize)
        .map(|p| p.name.clone())
        .unwrap_or_else(|| format!("#{i}"))
}

pub(crate) fn names(inv: &Inventory, list: &[u32]) -> Vec<String> {
    list.iter().map(|&i| name(inv, i)).collect()
}

pub(crate) fn show_list(list: &[String]) -> String {
    format!("[{}]", list.join(", "))
}

pub(crate) fn ref_name(inv: &Inventory, r: &PoolRef) -> String {
    match r {
        PoolRef::Index(i) => name(inv, *i),
        PoolRef::Missing(n) => n.clone(),
    }
}

pub fn compare(
    expect: &Expect,
    inv: &Inventory,
    result: &Result<Decision, PolicyError>,
) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let mut check = |what: String, expected: String, actual: String| {
        if expected != actual {
            out.push(Mismatch {
                what,
                expected,
                actual,
            });
        }
    };
    let decision = match (result, &expect.error, &expect.error_kind) {
        (Err(e), Some(text), kind) => {
            if !e.message.contains(text.as_str()) {
                check(
                    "error".into(),
                    format!("a message containing {text:?}"),
                    e.message.clone(),
                );
            }
            if let Some(kind) = kind {
                check("error kind".into(), kind.clone(), e.kind.as_str().into());
            }
            return out;
        }
        (Err(e), None, Some(kind)) => {
            check("error kind".into(), kind.clone(), e.kind.as_str().into());
            return out;
        }
        (Err(e), None, None) => {
            check(
                "decision".into(),
                "a decision".into(),
                format!("error ({}): {}", e.kind.as_str(), e.message),
            );
            return out;
        }
        (Ok(d), Some(text), _) => {
            check(
                "decision".into(),
                format!("an error containing {text:?}"),
                summarize(inv, d),
            );
            return out;
        }
        (Ok(d), None, Some(kind)) => {
            check(
                "decision".into(),
                format!("an error of kind {kind}"),
                summarize(inv, d),
            );
            return out;
        }
        (Ok(d), None, None) => d,
    };
    for (iface, nic_expect) in &expect.nics {
        let Some(nic) = decision.nics.iter().find(|n| &n.interface == iface) else {
            check(
                iface.to_string(),
                "a decision for this interface".into(),
                "none (is it in `nics`?)".into(),
            );
            continue;
        };
        compare_nic(iface, nic_expect, nic, inv, &mut check);
    }
    out
}

fn compare_nic(
    iface: &str,
    e: &NicExpect,
    nic: &allot_core::policy::NicDecision,
    inv: &Inventory,
    check: &mut impl FnMut(String, String, String),
) {
    let expects_error = e.error.is_some() || e.error_kind.is_some();
    match &nic.error {
        Some(err) if expects_error => {
            if let Some(text) = &e.error
                && !err.message.contains(text.as_str())
            {
                check(
                    format!("{iface} error"),
                    format!("a message containing {text:?}"),
                    err.message.clone(),
                );
            }
            if let Some(kind) = &e.error_kind {
                check(
                    format!("{iface} error kind"),
                    kind.clone(),
                    err.kind.as_str().into(),
                );
            }
            return;
        }
        Some(err) => {
            check(
                iface.to_string(),
                "a decision".into(),
                format!("error ({}): {}", err.kind.as_str(), err.message),
            );
            return;
        }
        None if expects_error => {
            let expected = match (&e.error, &e.error_kind) {
                (Some(text), _) => format!("an error containing {text:?}"),
                (None, Some(kind)) => format!("an error of kind {kind}"),
                (None, None) => unreachable!("expects_error"),
            };
            let actual: Vec<String> = nic
                .families
                .iter()
                .map(|f| format!("{}: {}", f.family, show_list(&names(inv, &f.order))))
                .collect();
            check(format!("{iface} error"), expected, actual.join(", "));
            return;
        }
        None => {}
    }
    if let Some(families) = &e.families {
        let actual: Vec<String> = nic.families.iter().map(|f| f.family.to_string()).collect();
        check(
            format!("{iface} families"),
            show_list(families),
            show_list(&actual),
        );
    }
    if let Some(cg) = e.clean_gateway {
        check(
            format!("{iface} cleanGateway"),
            cg.to_string(),
            nic.clean_gateway.to_string(),
        );
    }
    if let Some(routes) = &e.routes {
        let show = |r: &[allot_core::spec::RouteSpec]| {
            show_list(
                &r.iter()
                    .map(|r| format!("{} via {}", r.dst, r.gw))
                    .collect::<Vec<_>>(),
            )
        };
        check(format!("{iface} routes"), show(routes), show(&nic.routes));
    }
    for (family, fe) in [(IpFamily::V4, &e.ipv4), (IpFamily::V6, &e.ipv6)] {
        let Some(fe) = fe else { continue };
        match nic.families.iter().find(|f| f.family == family) {
            Some(fd) => compare_family(&format!("{iface} {family}"), fe, fd, inv, check),
            None => check(
                format!("{iface} {family}"),
                "a decision".into(),
                "no decision for this family".into(),
            ),
        }
    }
}

fn compare_family(
    at: &str,
    e: &FamilyExpect,
    fd: &FamilyDecision,
    inv: &Inventory,
    check: &mut impl FnMut(String, String, String),
) {
    if let Some(rule) = &e.rule {
        check(format!("{at} rule"), rule.clone(), fd.rule.as_str().into());
    }
    if let Some(source) = &e.source
        && !fd.source.contains(source.as_str())
    {
        check(
            format!("{at} source"),
            format!("containing {source:?}"),
            fd.source.clone(),
        );
    }
    if let Some(c) = &e.candidates {
        check(
            format!("{at} candidates"),
            show_list(c),
            show_list(&names(inv, &fd.candidates)),
        );
    }
    if let Some(o) = &e.order {
        check(
            format!("{at} order"),
            show_list(o),
            show_list(&names(inv, &fd.order)),
        );
    }
    if let Some(chosen) = &e.chosen {
        let actual = fd.order.first().map(|&i| name(inv, i));
        let show = |c: &Option<String>| c.clone().unwrap_or_else(|| "none".into());
        check(format!("{at} chosen"), show(chosen), show(&actual));
    }
    if let Some(address) = &e.address {
        let actual = fd.address.as_ref().map(|a| a.address.clone());
        let show = |c: &Option<String>| c.clone().unwrap_or_else(|| "none".into());
        check(format!("{at} address"), show(address), show(&actual));
    }
    if let Some(dropped) = &e.dropped {
        let show = |pairs: Vec<(String, String)>| {
            let mut pairs = pairs;
            pairs.sort();
            format!(
                "{{{}}}",
                pairs
                    .iter()
                    .map(|(n, r)| format!("{n}: {r}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let expected = dropped
            .iter()
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect();
        let actual = fd
            .dropped
            .iter()
            .map(|d| (ref_name(inv, &d.pool), d.reason.as_str().to_string()))
            .collect();
        check(format!("{at} dropped"), show(expected), show(actual));
    }
}

fn summarize(inv: &Inventory, d: &Decision) -> String {
    let mut s = String::new();
    for nic in &d.nics {
        if let Some(e) = &nic.error {
            let _ = write!(
                s,
                "{} error ({}): {} ",
                nic.interface,
                e.kind.as_str(),
                e.message
            );
        }
        for f in &nic.families {
            let _ = write!(
                s,
                "{} {}: {} ",
                nic.interface,
                f.family,
                show_list(&names(inv, &f.order))
            );
        }
    }
    if s.is_empty() {
        "an empty decision".into()
    } else {
        s.trim_end().into()
    }
}

/// The whole trace of a decision, for `allotctl policy explain`.
pub fn explain(inv: &Inventory, req: &Request, result: &Result<Decision, PolicyError>) -> String {
    let mut s = String::new();
    let d = match result {
        Err(e) => {
            let _ = writeln!(s, "error ({}): {}", e.kind.as_str(), e.message);
            return s;
        }
        Ok(d) => d,
    };
    for nic in &d.nics {
        let _ = writeln!(s, "interface {}", nic.interface);
        if let Some(e) = &nic.error {
            let _ = writeln!(s, "  error ({}): {}", e.kind.as_str(), e.message);
            continue;
        }
        if nic.clean_gateway {
            let _ = writeln!(s, "  clean gateway: yes");
        }
        for r in &nic.routes {
            let _ = writeln!(s, "  route {} via {}", r.dst, r.gw);
        }
        if nic.families.is_empty() {
            let _ = writeln!(s, "  no IP family decided");
        }
        for f in &nic.families {
            let _ = writeln!(s, "  {}: rule {} ({})", f.family, f.rule, f.source);
            let _ = writeln!(
                s,
                "    candidates: {}",
                show_list(&names(inv, &f.candidates))
            );
            if f.order.is_empty() {
                let _ = writeln!(s, "    order: none left");
            } else {
                let _ = writeln!(s, "    order:");
                for (n, &i) in f.order.iter().enumerate() {
                    let p = &inv.pools[i as usize];
                    let free = req.free_counts.get(i as usize).copied().unwrap_or(0);
                    let _ = writeln!(
                        s,
                        "      {}. {} ({}, {free} free of {})",
                        n + 1,
                        p.name,
                        p.spec.subnet,
                        p.total_count
                    );
                }
            }
            for dr in &f.dropped {
                let why = describe_drop(inv, req, &nic.interface, dr);
                let _ = writeln!(
                    s,
                    "    dropped {}: {} ({why})",
                    ref_name(inv, &dr.pool),
                    dr.reason
                );
            }
            match f.order.first() {
                Some(&i) => {
                    let _ = writeln!(s, "    chosen: {}", name(inv, i));
                }
                None => {
                    let _ = writeln!(s, "    chosen: none: no pool can serve this pod here");
                }
            }
            if let Some(a) = &f.address {
                let _ = writeln!(
                    s,
                    "    address: {} ({}; the host takes it from a pool of the order or fails)",
                    a.address, a.source
                );
            }
        }
    }
    s
}

/// Renders one failure as readable `-`/`+` lines.
pub fn render_failure(mismatches: &[Mismatch]) -> String {
    let mut s = String::new();
    for m in mismatches {
        let _ = writeln!(s, "    {}:", m.what);
        let _ = writeln!(s, "      - expected {}", m.expected);
        let _ = writeln!(s, "      + actual   {}", m.actual);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::load_file;

    #[test]
    fn a_failing_expectation_is_reported_with_both_sides() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.yaml");
        std::fs::write(
            &path,
            r#"
pools:
  - metadata: {name: a}
    spec: {subnet: 10.0.0.0/24, default: true}
  - metadata: {name: b}
    spec: {subnet: 10.0.1.0/24, default: true}
expect:
  nics:
    eth0:
      ipv4: {order: [b, a], chosen: b, dropped: {}}
"#,
        )
        .unwrap();
        let loaded = load_file(&path);
        let scenario = loaded[0].scenario.as_ref().unwrap();
        let inputs = scenario.inputs(1).unwrap();
        let fd = allot_core::policy::FamilyDecision {
            family: IpFamily::V4,
            rule: allot_core::policy::AcquisitionRule::ClusterDefault,
            source: String::new(),
            candidates: vec![0, 1],
            order: vec![0, 1],
            dropped: vec![],
            address: None,
        };
        let decision = Decision {
            nics: vec![allot_core::policy::NicDecision {
                interface: "eth0".into(),
                error: None,
                clean_gateway: false,
                routes: vec![],
                families: vec![fd],
            }],
        };
        let m = compare(&scenario.expect, &inputs.inventory, &Ok(decision));
        assert_eq!(
            m,
            vec![
                Mismatch {
                    what: "eth0 ipv4 order".into(),
                    expected: "[b, a]".into(),
                    actual: "[a, b]".into()
                },
                Mismatch {
                    what: "eth0 ipv4 chosen".into(),
                    expected: "b".into(),
                    actual: "a".into()
                },
            ]
        );
        let text = render_failure(&m);
        assert!(
            text.contains("- expected [b, a]") && text.contains("+ actual   [a, b]"),
            "{text}"
        );
    }

    #[test]
    fn a_scenario_that_expects_nothing_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.yaml");
        std::fs::write(&path, "pools: []\nexpect: {}\n").unwrap();
        let loaded = load_file(&path);
        assert!(
            loaded[0]
                .scenario
                .as_ref()
                .unwrap_err()
                .contains("expects nothing")
        );
    }

    #[test]
    fn unknown_fields_in_scenarios_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("typo.yaml");
        std::fs::write(
            &path,
            "pools: []\nexpect: {nics: {eth0: {ipv4: {oder: [a]}}}}\n",
        )
        .unwrap();
        let loaded = load_file(&path);
        assert!(
            loaded[0]
                .scenario
                .as_ref()
                .unwrap_err()
                .contains("unknown field `oder`")
        );
    }

    #[test]
    fn objects_that_make_no_inventory_say_which_and_why() {
        use crate::scenario::InputsError;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.yaml");
        std::fs::write(
            &path,
            "pools:\n  - kind: Subnet\n    metadata: {name: a}\n    spec: {subnet: 10.0.0.0/24}\n\
             expect: {error: x}\n---\n\
             pools:\n  - metadata: {name: b}\n    spec: {subnet: nope}\nexpect: {error: x}\n",
        )
        .unwrap();
        let loaded = load_file(&path);
        let inputs = |i: usize| loaded[i].scenario.as_ref().unwrap().inputs(1).err();
        let wrong = inputs(0).expect("a Subnet among the pools");
        assert!(matches!(&wrong, InputsError::WrongKind { kind, .. } if kind == "Subnet"));
        assert_eq!(wrong.to_string(), "a is a Subnet where a IPPool belongs");
        let invalid = inputs(1).expect("a pool whose subnet is no CIDR");
        assert!(matches!(invalid, InputsError::Invalid(_)), "{invalid}");
        assert!(
            std::error::Error::source(&invalid).is_some(),
            "the spec error is kept"
        );
    }
}
