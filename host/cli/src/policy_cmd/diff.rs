//! `allotctl policy diff --policy A.wasm --policy B.wasm SCENARIOS…`: every scenario whose
//! decision differs between two policies, NIC by NIC and family by family, with both decisions.
//! Only the decisions are compared, not the scenarios' expectations: recorded traffic
//! (`allotctl policy record`) replays against a candidate policy before it ships.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use allot_core::PolicyError;
use allot_core::policy::{Decision, FamilyDecision, Inventory, Policy};

use crate::harness::{names, ref_name, show_list};
use crate::scenario::Loaded;

/// Where in a decision two policies differ: (interface, part) → rendering. Part is a family
/// (`ipv4`, `ipv6`), `nic` (the NIC's error, cleanGateway, routes), or for a failed request
/// the pair (`*`, `request`).
pub type Rendered = BTreeMap<(String, String), String>;

/// What `diff` found.
#[derive(Debug, Default)]
pub struct Report {
    pub same: usize,
    /// (scenario label, text naming each differing NIC/family with both decisions).
    pub differing: Vec<(String, String)>,
    /// Scenarios that could not be run (unreadable, invalid inventory), with why.
    pub broken: Vec<(String, String)>,
}

pub fn diff(a: &dyn Policy, b: &dyn Policy, scenarios: &[Loaded]) -> Report {
    let mut report = Report::default();
    for (n, loaded) in scenarios.iter().enumerate() {
        let scenario = match &loaded.scenario {
            Ok(s) => s,
            Err(e) => {
                report.broken.push((loaded.label.clone(), e.clone()));
                continue;
            }
        };
        let inputs = match scenario.inputs(n as u64 + 1) {
            Ok(i) => i,
            Err(e) => {
                report
                    .broken
                    .push((loaded.label.clone(), format!("invalid inventory: {e}")));
                continue;
            }
        };
        let inv = &inputs.inventory;
        let left = render(inv, &a.decide(inv, &inputs.request));
        let right = render(inv, &b.decide(inv, &inputs.request));
        if left == right {
            report.same += 1;
            continue;
        }
        let mut text = String::new();
        let keys: std::collections::BTreeSet<&(String, String)> =
            left.keys().chain(right.keys()).collect();
        let none = "(nothing)".to_string();
        for key in keys {
            let (l, r) = (
                left.get(key).unwrap_or(&none),
                right.get(key).unwrap_or(&none),
            );
            if l != r {
                let (iface, part) = key;
                let _ = writeln!(text, "  {iface} {part}:");
                let _ = writeln!(text, "    A: {l}");
                let _ = writeln!(text, "    B: {r}");
            }
        }
        report.differing.push((loaded.label.clone(), text));
    }
    report
}

/// A decision as comparable, readable parts.
pub fn render(inv: &Inventory, result: &Result<Decision, PolicyError>) -> Rendered {
    let mut out = Rendered::new();
    let decision = match result {
        Ok(d) => d,
        Err(e) => {
            out.insert(
                ("*".into(), "request".into()),
                format!("error ({}): {}", e.kind.as_str(), e.message),
            );
            return out;
        }
    };
    for nic in &decision.nics {
        let nic_part = match &nic.error {
            Some(e) => format!("error ({}): {}", e.kind.as_str(), e.message),
            None => {
                let routes: Vec<String> = nic
                    .routes
                    .iter()
                    .map(|r| format!("{} via {}", r.dst, r.gw))
                    .collect();
                format!(
                    "cleanGateway {}, routes {}, families {}",
                    nic.clean_gateway,
                    show_list(&routes),
                    show_list(
                        &nic.families
                            .iter()
                            .map(|f| f.family.to_string())
                            .collect::<Vec<_>>()
                    )
                )
            }
        };
        out.insert((nic.interface.clone(), "nic".into()), nic_part);
        for f in &nic.families {
            out.insert(
                (nic.interface.clone(), f.family.to_string()),
                family(inv, f),
            );
        }
    }
    out
}

fn family(inv: &Inventory, f: &FamilyDecision) -> String {
    let mut dropped: Vec<String> = f
        .dropped
        .iter()
        .map(|d| {
            let name = ref_name(inv, &d.pool);
            if d.detail.is_empty() {
                format!("{name}: {}", d.reason)
            } else {
                format!("{name}: {} ({})", d.reason, d.detail)
            }
        })
        .collect();
    dropped.sort();
    let chosen = f
        .order
        .first()
        .map(|&i| names(inv, &[i]).remove(0))
        .unwrap_or_else(|| "none".into());
    format!(
        "chosen {chosen}; order {}; rule {} ({}); candidates {}; dropped {{{}}}",
        show_list(&names(inv, &f.order)),
        f.rule,
        f.source,
        show_list(&names(inv, &f.candidates)),
        dropped.join(", ")
    )
}
