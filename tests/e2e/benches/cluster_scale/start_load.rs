//! The load an IPAM's start puts on the API server: the WATCH requests its processes hold
//! and what each of them lists at start (from the audit log), for the report's extrapolation
//! to 1,000 nodes. Apart from [`crate::phases`], which runs the phases, because it reads the
//! install rather than a phase, and to keep that file readable.

use std::collections::BTreeMap;

use allot_cluster_tests::Suite;

use crate::measure::{self, ApiMetrics, AuditCursor};

/// The load of the IPAM's watches and start-up lists.
#[derive(Clone, Debug, Default)]
pub struct WatchLoad {
    /// WATCH requests held, by resource: after install minus before.
    pub watches: BTreeMap<String, f64>,
    pub registered_watchers: f64,
    /// Per process kind (user agent) of the IPAM: list requests at start by source address
    /// (one process per node or replica), and per list URI the objects it returns now.
    pub lists: Vec<StartList>,
}

#[derive(Clone, Debug)]
pub struct StartList {
    pub agent: String,
    pub user: String,
    pub uri: String,
    /// Processes (source addresses) that made this list.
    pub processes: usize,
    pub objects: usize,
}

/// The IPAM's start: WATCH requests held (after minus before), and what its processes listed
/// (from the audit log since `audit` was placed, each list URI asked again to count objects).
pub fn watch_load(
    audit: &mut AuditCursor,
    nodes: &[allot_lab::NodeInfo],
    users: &[String],
    before: &ApiMetrics,
    after: &ApiMetrics,
) -> WatchLoad {
    let mut watches = after.watches.clone();
    for (r, v) in &before.watches {
        *watches.entry(r.clone()).or_default() -= v;
    }
    watches.retain(|_, v| v.abs() > 0.5);
    let audited = audit.read().unwrap_or_default();
    let mut lists: BTreeMap<(String, String, String), Vec<String>> = BTreeMap::new();
    for r in audited
        .iter()
        .filter(|r| r.verb == "list" && users.iter().any(|u| r.user.starts_with(u.as_str())))
    {
        // The URI without the paging and resourceVersion parameters, a node's name as <node>.
        let uri = node_neutral(&strip_params(&r.uri), nodes);
        lists
            .entry((r.agent.clone(), r.user.clone(), uri))
            .or_default()
            .push(r.source.clone());
    }
    let lists = lists
        .into_iter()
        .map(|((agent, user, uri), mut sources)| {
            sources.sort();
            sources.dedup();
            StartList {
                agent,
                user,
                uri,
                processes: sources.len(),
                objects: 0,
            }
        })
        .collect();
    WatchLoad {
        watches,
        registered_watchers: after.registered_watchers - before.registered_watchers,
        lists,
    }
}

fn strip_params(uri: &str) -> String {
    let Some((path, query)) = uri.split_once('?') else {
        return uri.to_string();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| {
            let key = kv.split('=').next().unwrap_or_default();
            !matches!(
                key,
                "limit"
                    | "resourceVersion"
                    | "resourceVersionMatch"
                    | "continue"
                    | "timeout"
                    | "timeoutSeconds"
                    | "allowWatchBookmarks"
                    | "sendInitialEvents"
            )
        })
        .collect();
    if kept.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", kept.join("&"))
    }
}

/// Counts what each start-up list returns now (for a node-scoped list, on the first node).
pub fn count_lists(s: &Suite, watch: &mut WatchLoad, node: &str) {
    let kubeconfig = s.lab.kubeconfig();
    for l in &mut watch.lists {
        let uri = l.uri.replace("<node>", node);
        l.objects = measure::kubectl(&kubeconfig, &["get", "--raw", &uri])
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["items"].as_array().map(|i| i.len()))
            .unwrap_or(0);
    }
}

/// `uri` with every lab node's name in a field selector written `<node>`.
fn node_neutral(uri: &str, nodes: &[allot_lab::NodeInfo]) -> String {
    let mut names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    // node-10 before node-1.
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let mut out = uri.to_string();
    for name in names {
        for end in ["&", ""] {
            let from = format!("%3D{name}{end}");
            if end.is_empty() && !out.ends_with(&from) {
                continue;
            }
            out = out.replace(&from, &format!("%3D<node>{end}"));
        }
    }
    out
}
