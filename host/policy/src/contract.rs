//! The versions of the `allot:policy` contract this host accepts, one set of bindings each (as
//! Zed does for its extensions): `wit/policy.wit` is the current 0.3.0, `wit/0.2.0/` and
//! `wit/0.1.0/` the frozen older ones. A component is bound by the version of
//! `allot:policy/policy` it exports, and every version converts to the same allot-core types,
//! so the rest of the host never sees which one a policy was built against.
//!
//! 0.2.0 added `nic-decision.error` (a policy can fail one NIC and still decide the others);
//! a 0.1.0 component's NIC decisions never carry one. 0.3.0 sends the namespace and node only
//! when they differ from the instance's previous call (so a 0.3.0 instance remembers what it
//! was sent), and added `family-decision.address` (a policy may name the address a NIC must
//! get); older components never name one.

use std::sync::Arc;
use std::time::Instant;

use allot_core::PolicyError;
use allot_core::policy::{Decision, Inventory, NamespaceInfo, NodeInfo, Request};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Engine, Store};

mod convert;

pub(crate) mod v0_1 {
    wasmtime::component::bindgen!({
        world: "pool-policy",
        path: "../../wit/0.1.0",
    });
}

pub(crate) mod v0_2 {
    wasmtime::component::bindgen!({
        world: "pool-policy",
        path: "../../wit/0.2.0",
    });
}

pub(crate) mod v0_3 {
    wasmtime::component::bindgen!({
        world: "pool-policy",
        path: "../../wit",
    });
}

/// Log lines a policy may emit per call, and their length; the rest are counted and dropped.
const MAX_LOG_LINES: usize = 32;
const MAX_LOG_LINE: usize = 1024;

/// What a store carries: the memory cap and the policy's log lines for the current call. Owned
/// here because the contract's host imports act on it; the runtime makes one per store and
/// reads what a call left in it.
pub(crate) struct HostState {
    pub(crate) policy_name: Arc<str>,
    pub(crate) memory_cap: usize,
    pub(crate) memory_cap_hit: Option<usize>,
    pub(crate) log_lines: usize,
    pub(crate) last_panic: Option<String>,
    /// When the current call's time is up, by the wall clock. The epoch is only a cheap
    /// trigger: a ticker starved by a loaded machine catches up in a burst, and a call started
    /// just before the burst must not be stopped early (see `wall_clock_deadline`).
    pub(crate) wall_deadline: Option<Instant>,
}

impl HostState {
    /// The contract's one import, whichever version the policy was built against.
    pub(crate) fn log(&mut self, level: tracing::Level, message: &str) {
        if let Some(panic) = message.strip_prefix("panic: ") {
            self.last_panic = Some(truncate(panic, MAX_LOG_LINE).to_string());
        }
        self.log_lines += 1;
        if self.log_lines > MAX_LOG_LINES {
            return;
        }
        let message = truncate(message, MAX_LOG_LINE);
        let policy = &*self.policy_name;
        match level {
            tracing::Level::ERROR => tracing::error!(policy, "{message}"),
            tracing::Level::WARN => tracing::warn!(policy, "{message}"),
            tracing::Level::INFO => tracing::info!(policy, "{message}"),
            _ => tracing::debug!(policy, "{message}"),
        }
    }
}

fn truncate(s: &str, max: usize) -> &str {
    &s[..s.floor_char_boundary(max)]
}

/// The export each version's component carries, newest first.
const POLICY_EXPORTS: [(&str, Version); 3] = [
    ("allot:policy/policy@0.3.0", Version::V0_3),
    ("allot:policy/policy@0.2.0", Version::V0_2),
    ("allot:policy/policy@0.1.0", Version::V0_1),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Version {
    V0_1,
    V0_2,
    V0_3,
}

impl Version {
    fn detect(engine: &Engine, component: &Component) -> wasmtime::Result<Version> {
        let exports: Vec<String> = component
            .component_type()
            .exports(engine)
            .map(|(name, _)| name.to_string())
            .collect();
        POLICY_EXPORTS
            .iter()
            .find(|(name, _)| exports.iter().any(|e| e == name))
            .map(|&(_, version)| version)
            .ok_or_else(|| {
                wasmtime::format_err!(
                    "it exports none of {} (its exports: {}); build it against wit/policy.wit with \
                     the allot policy SDK",
                    POLICY_EXPORTS.map(|(name, _)| name).join(", "),
                    if exports.is_empty() {
                        "none".to_string()
                    } else {
                        exports.join(", ")
                    }
                )
            })
    }
}

/// A component linked against the bindings of the version it exports.
pub(crate) enum Pre {
    V0_1(v0_1::PoolPolicyPre<HostState>),
    V0_2(v0_2::PoolPolicyPre<HostState>),
    V0_3(v0_3::PoolPolicyPre<HostState>),
}

/// A live instance of any version.
pub(crate) enum Instance {
    V0_1(v0_1::PoolPolicy),
    V0_2(v0_2::PoolPolicy),
    V0_3(v0_3::PoolPolicy, Sent),
}

/// What a 0.3.0 instance was last sent, so that an unchanged namespace or node is left out.
#[derive(Default)]
pub(crate) struct Sent {
    namespace: Option<NamespaceInfo>,
    node: Option<NodeInfo>,
}

/// The inventory converted for one version's guests.
pub(crate) enum GuestInventory {
    V0_1(v0_1::allot::policy::types::Inventory),
    V0_2(v0_2::allot::policy::types::Inventory),
    V0_3(v0_3::allot::policy::types::Inventory),
}

impl Pre {
    pub(crate) fn new(engine: &Engine, component: &Component) -> wasmtime::Result<Self> {
        let mut linker: Linker<HostState> = Linker::new(engine);
        let version = Version::detect(engine, component)?;
        match version {
            Version::V0_1 => v0_1::PoolPolicy::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?,
            Version::V0_2 => v0_2::PoolPolicy::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?,
            Version::V0_3 => v0_3::PoolPolicy::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?,
        }
        // A policy built with std may still name WASI functions it never calls (stderr for
        // panics). They get no capability: calling one traps.
        linker.define_unknown_imports_as_traps(component)?;
        let pre = linker.instantiate_pre(component)?;
        Ok(match version {
            Version::V0_1 => Pre::V0_1(v0_1::PoolPolicyPre::new(pre)?),
            Version::V0_2 => Pre::V0_2(v0_2::PoolPolicyPre::new(pre)?),
            Version::V0_3 => Pre::V0_3(v0_3::PoolPolicyPre::new(pre)?),
        })
    }

    pub(crate) fn version(&self) -> &'static str {
        match self {
            Pre::V0_1(_) => "0.1.0",
            Pre::V0_2(_) => "0.2.0",
            Pre::V0_3(_) => "0.3.0",
        }
    }

    pub(crate) fn instantiate(&self, store: &mut Store<HostState>) -> wasmtime::Result<Instance> {
        Ok(match self {
            Pre::V0_1(pre) => Instance::V0_1(pre.instantiate(store)?),
            Pre::V0_2(pre) => Instance::V0_2(pre.instantiate(store)?),
            Pre::V0_3(pre) => Instance::V0_3(pre.instantiate(store)?, Sent::default()),
        })
    }

    pub(crate) fn convert_inventory(&self, inventory: &Inventory) -> GuestInventory {
        match self {
            Pre::V0_1(_) => GuestInventory::V0_1(convert::v0_1::inventory(inventory)),
            Pre::V0_2(_) => GuestInventory::V0_2(convert::v0_2::inventory(inventory)),
            Pre::V0_3(_) => GuestInventory::V0_3(convert::v0_3::inventory(inventory)),
        }
    }
}

impl Instance {
    pub(crate) fn load_inventory(
        &self,
        store: &mut Store<HostState>,
        inventory: &GuestInventory,
    ) -> wasmtime::Result<()> {
        match (self, inventory) {
            (Instance::V0_1(i), GuestInventory::V0_1(inv)) => {
                i.allot_policy_policy().call_load_inventory(store, inv)
            }
            (Instance::V0_2(i), GuestInventory::V0_2(inv)) => {
                i.allot_policy_policy().call_load_inventory(store, inv)
            }
            (Instance::V0_3(i, _), GuestInventory::V0_3(inv)) => {
                i.allot_policy_policy().call_load_inventory(store, inv)
            }
            _ => wasmtime::bail!("an inventory converted for another contract version"),
        }
    }

    /// Ok(verdict) when the guest returned normally; Err on a trap.
    pub(crate) fn decide(
        &mut self,
        store: &mut Store<HostState>,
        generation: u64,
        request: &Request,
    ) -> wasmtime::Result<Result<Decision, PolicyError>> {
        Ok(match self {
            Instance::V0_1(i) => i
                .allot_policy_policy()
                .call_decide(store, &convert::v0_1::request(generation, request))?
                .map(convert::v0_1::decision)
                .map_err(convert::v0_1::decision_error),
            Instance::V0_2(i) => i
                .allot_policy_policy()
                .call_decide(store, &convert::v0_2::request(generation, request))?
                .map(convert::v0_2::decision)
                .map_err(convert::v0_2::decision_error),
            Instance::V0_3(i, sent) => {
                let send_namespace = sent.namespace.as_ref() != Some(&request.namespace);
                let send_node = sent.node.as_ref() != Some(&request.node);
                let wit = convert::v0_3::request(generation, request, send_namespace, send_node);
                // Remembered before the call: the guest keeps what it is sent even when it then
                // answers with an error. A trap discards the instance, and this with it.
                if send_namespace {
                    sent.namespace = Some(request.namespace.clone());
                }
                if send_node {
                    sent.node = Some(request.node.clone());
                }
                i.allot_policy_policy()
                    .call_decide(store, &wit)?
                    .map(convert::v0_3::decision)
                    .map_err(convert::v0_3::decision_error)
            }
        })
    }
}

macro_rules! host_imports {
    ($version:ident) => {
        impl $version::allot::policy::host::Host for HostState {
            fn log(&mut self, level: $version::allot::policy::types::LogLevel, message: String) {
                use $version::allot::policy::types::LogLevel;
                let level = match level {
                    LogLevel::Error => tracing::Level::ERROR,
                    LogLevel::Warn => tracing::Level::WARN,
                    LogLevel::Info => tracing::Level::INFO,
                    LogLevel::Debug => tracing::Level::DEBUG,
                };
                self.log(level, &message);
            }
        }

        impl $version::allot::policy::types::Host for HostState {}
    };
}

host_imports!(v0_1);
host_imports!(v0_2);
host_imports!(v0_3);
