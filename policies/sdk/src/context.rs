//! What a stage sees: the inventory, the request, and fast lookups built once per inventory.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, DefaultHasher};

use crate::types::{
    DecisionError, Inventory, IpFamily, Label, Namespace, Node, Pool, PoolRef, Request, Subnet,
};
use crate::wildcard;
use crate::{DropReason, Dropped};

/// A fixed-key hasher: `RandomState` would import `wasi:random`, and a policy imports nothing but
/// the host's log function.
type NameMap = HashMap<String, u32, BuildHasherDefault<DefaultHasher>>;

/// Lookups built once per inventory generation.
#[derive(Debug, Default)]
pub(crate) struct Index {
    pub(crate) pools: NameMap,
    pub(crate) subnets: NameMap,
}

impl Index {
    pub(crate) fn new(inventory: &Inventory) -> Self {
        Index {
            pools: inventory
                .pools
                .iter()
                .enumerate()
                .map(|(i, p)| (p.name.clone(), i as u32))
                .collect(),
            subnets: inventory
                .subnets
                .iter()
                .enumerate()
                .map(|(i, s)| (s.name.clone(), i as u32))
                .collect(),
        }
    }
}

/// Verdicts that depend only on a pool and the node (or the namespace), kept across calls for
/// one inventory generation: an agent serves one node, so its node checks are the same for every
/// pod, and a namespace's for every pod in it. Reset when another node (or namespace) is sent.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    node_verdicts: Vec<Verdict>,
    namespace_verdicts: Vec<Verdict>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Verdict {
    #[default]
    Unknown,
    Fails,
    Passes,
}

/// The namespace and node last sent. A 0.3.0 host sends them only when they change, so an
/// instance keeps them across calls and across inventory loads.
#[derive(Debug, Default)]
pub(crate) struct Known {
    pub(crate) namespace: Option<Namespace>,
    pub(crate) node: Option<Node>,
}

impl Memo {
    /// Takes what the request sends (a namespace or node absent from it is the one known), and
    /// forgets the verdicts computed for another node or namespace.
    pub(crate) fn prepare(
        &mut self,
        known: &mut Known,
        request: &Request,
        pools: usize,
    ) -> Result<(), DecisionError> {
        if let Some(node) = &request.node
            && known.node.as_ref() != Some(node)
        {
            known.node = Some(node.clone());
            self.node_verdicts.clear();
        }
        if let Some(namespace) = &request.namespace
            && known.namespace.as_ref() != Some(namespace)
        {
            known.namespace = Some(namespace.clone());
            self.namespace_verdicts.clear();
        }
        if known.node.is_none() || known.namespace.is_none() {
            return Err(DecisionError::internal(
                "the request leaves out the namespace or node, but this instance was never sent one",
            ));
        }
        self.node_verdicts.resize(pools, Verdict::Unknown);
        self.namespace_verdicts.resize(pools, Verdict::Unknown);
        Ok(())
    }
}

fn remembered(verdicts: &mut [Verdict], index: u32, check: impl FnOnce() -> bool) -> bool {
    let Some(slot) = verdicts.get_mut(index as usize) else {
        return check();
    };
    match *slot {
        Verdict::Passes => true,
        Verdict::Fails => false,
        Verdict::Unknown => {
            let passes = check();
            *slot = if passes {
                Verdict::Passes
            } else {
                Verdict::Fails
            };
            passes
        }
    }
}

/// The inventory and request of one decision.
pub struct Context<'a> {
    pub inventory: &'a Inventory,
    /// The request as sent: its `namespace` and `node` may be absent (unchanged since the last
    /// call); read [`Context::namespace`] and [`Context::node`] instead.
    pub request: &'a Request,
    /// The pod's namespace, whether this request sent it or an earlier one did.
    pub namespace: &'a Namespace,
    /// The node, likewise.
    pub node: &'a Node,
    pub(crate) index: &'a Index,
    pub(crate) memo: &'a RefCell<Memo>,
}

/// Names resolved against the inventory.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Resolved {
    /// Matching pools, in the order the names were given (a wildcard expands in name order);
    /// each pool at most once.
    pub candidates: Vec<u32>,
    /// Names and patterns that matched nothing, as `not-found` drops.
    pub missing: Vec<Dropped>,
}

impl<'a> Context<'a> {
    #[inline]
    pub fn pools(&self) -> &'a [Pool] {
        &self.inventory.pools
    }

    #[inline]
    pub fn pool(&self, index: u32) -> &'a Pool {
        &self.inventory.pools[index as usize]
    }

    #[inline]
    pub fn pool_index(&self, name: &str) -> Option<u32> {
        self.index.pools.get(name).copied()
    }

    #[inline]
    pub fn subnet(&self, name: &str) -> Option<&'a Subnet> {
        self.index
            .subnets
            .get(name)
            .map(|&i| &self.inventory.subnets[i as usize])
    }

    /// Free addresses of pool `index` (0 when the host sent no count for it).
    #[inline]
    pub fn free(&self, index: u32) -> u64 {
        self.request
            .free_counts
            .get(index as usize)
            .copied()
            .unwrap_or(0)
    }

    #[inline]
    pub fn pod_labels(&self) -> &'a [Label] {
        &self.request.pod.labels
    }

    #[inline]
    pub fn pod_annotations(&self) -> &'a [Label] {
        &self.request.pod.annotations
    }

    #[inline]
    pub fn namespace_labels(&self) -> &'a [Label] {
        &self.namespace.labels
    }

    #[inline]
    pub fn namespace_annotations(&self) -> &'a [Label] {
        &self.namespace.annotations
    }

    #[inline]
    pub fn node_labels(&self) -> &'a [Label] {
        &self.node.labels
    }

    /// The pod's StatefulSet ordinal ([`crate::addresses::ordinal`]).
    #[inline]
    pub fn ordinal(&self) -> Option<u64> {
        crate::addresses::ordinal(self)
    }

    /// `check()` for pool `index`, computed once per node and inventory generation. Only for a
    /// check whose outcome depends on nothing but the pool and the request's node (its name and
    /// labels), like nodeName and nodeAffinity: later requests for the same node reuse it.
    pub fn node_verdict(&self, index: u32, check: impl FnOnce() -> bool) -> bool {
        match self.memo.try_borrow_mut() {
            Ok(mut memo) => remembered(&mut memo.node_verdicts, index, check),
            // Called from within another check: compute, do not cache.
            Err(_) => check(),
        }
    }

    /// As [`Context::node_verdict`], for a check that depends only on the pool and the request's
    /// namespace (its name, labels and annotations), like namespaceName and namespaceAffinity.
    pub fn namespace_verdict(&self, index: u32, check: impl FnOnce() -> bool) -> bool {
        match self.memo.try_borrow_mut() {
            Ok(mut memo) => remembered(&mut memo.namespace_verdicts, index, check),
            Err(_) => check(),
        }
    }

    /// Resolves pool names and wildcard patterns to indices, keeping the user's order.
    pub fn resolve_pools<S: AsRef<str>>(&self, names: &[S]) -> Resolved {
        let mut out = Resolved::default();
        let mut seen = vec![false; self.inventory.pools.len()];
        let mut take = |i: u32, out: &mut Resolved| {
            if !std::mem::replace(&mut seen[i as usize], true) {
                out.candidates.push(i);
            }
        };
        for name in names {
            let name = name.as_ref();
            if wildcard::is_pattern(name) {
                let before = out.candidates.len();
                let mut any = false;
                for (i, p) in self.inventory.pools.iter().enumerate() {
                    if wildcard::matches(name, &p.name) {
                        any = true;
                        take(i as u32, &mut out);
                    }
                }
                if !any && out.candidates.len() == before {
                    out.missing
                        .push(missing(name, format!("no IPPool matches pattern {name}")));
                }
            } else {
                match self.pool_index(name) {
                    Some(i) => take(i, &mut out),
                    None => out
                        .missing
                        .push(missing(name, format!("no IPPool named {name}"))),
                }
            }
        }
        out
    }

    /// Indices of pools of `family` for which `keep` holds, in inventory (name) order.
    pub fn pools_where(&self, family: IpFamily, keep: impl Fn(&Pool) -> bool) -> Vec<u32> {
        self.inventory
            .pools
            .iter()
            .enumerate()
            .filter(|(_, p)| p.ip_version == family && keep(p))
            .map(|(i, _)| i as u32)
            .collect()
    }
}

/// A `not-found` drop for a name or pattern.
pub fn missing(name: &str, detail: String) -> Dropped {
    Dropped {
        pool: PoolRef::Missing(name.to_string()),
        reason: DropReason::NotFound,
        detail,
    }
}
