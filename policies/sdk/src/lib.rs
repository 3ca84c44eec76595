//! The allot policy SDK: everything a pool-selection policy needs besides its own rules.
//!
//! A policy is three stages, each a method of [`Policy`] that an author may replace on its own:
//!
//! 1. [`Policy::acquire`]: which pools are candidates for a NIC, per IP family, and by which rule;
//! 2. [`Policy::filter`]: whether one candidate can serve this pod here (or why not);
//! 3. [`Policy::sort`]: the order of the survivors (stable: equal pools keep the user's order);
//! 4. [`Policy::address`] (contract 0.3.0, optional): the address the NIC must get in a family,
//!    when the policy names one (a pod annotation, a StatefulSet ordinal's entry of a list); the
//!    host honours it only inside a pool of the order, or fails the NIC saying why.
//!
//! The default policy's stages are in the `allot-policy-default` crate, so a custom policy can
//! reuse two of them and replace the third. [`export_policy!`] turns a type implementing
//! [`Policy`] into a WebAssembly component; [`Loaded::decide`] runs the same pipeline natively,
//! which is how policies are unit-tested and benchmarked.

// The generated bindings and export macro name this crate by its absolute path.
extern crate self as allot_policy_sdk;

pub mod addresses;
pub mod annotations;
mod context;
pub mod log;
mod pipeline;
pub mod selector;
pub mod wildcard;

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "pool-policy",
        path: "../../wit",
        pub_export_macro: true,
        export_macro_name: "__export_guest",
        default_bindings_module: "::allot_policy_sdk::bindings",
        runtime_path: "::allot_policy_sdk::__wit_bindgen::rt",
        additional_derives: [PartialEq],
    });
}

#[doc(hidden)]
pub use wit_bindgen as __wit_bindgen;

/// The contract's data types (`wit/policy.wit`, interface `types`).
pub mod types {
    pub use crate::bindings::allot::policy::types::*;
}

/// Sends panic messages through the host's log so the host can name them in its error. Done by
/// [`export_policy!`]; call it yourself when implementing the raw bindings' `Guest` trait.
pub use __runtime::install_panic_hook;
pub use context::{Context, Resolved, missing};
pub use pipeline::{Acquisition, FamilyCandidates, Loaded, Rejection};
pub use types::{
    AcquisitionRule, AddressHint, Decision, DecisionError, DropReason, Dropped, ErrorKind,
    IpFamily, Nic, Pool, PoolRef, Request, Route,
};

/// The interface that single-NIC annotations (`ippool`, `subnet`, `ip`, Calico's `ipAddrs`)
/// apply to unless they name one: Kubernetes' primary interface.
pub const PRIMARY_INTERFACE: &str = "eth0";

/// A pool-selection policy, as three replaceable stages.
pub trait Policy {
    /// Candidate pools for `nic`, per IP family, in the order the user listed them, with the rule
    /// that produced them. Names that match no pool go into `FamilyCandidates::missing`.
    fn acquire(ctx: &Context, nic: &Nic) -> Result<Acquisition, DecisionError>;

    /// `Ok(())` when pool `index` may serve `nic` for `family`, else why not.
    fn filter(ctx: &Context, nic: &Nic, family: IpFamily, index: u32) -> Result<(), Rejection>;

    /// Orders the surviving candidates in place, best first. Use a stable sort.
    fn sort(ctx: &Context, nic: &Nic, family: IpFamily, order: &mut [u32]);

    /// The address `nic` must get in `family`, if the policy names one (contract 0.3.0), given
    /// the final `order`. The host takes it from a pool of `order` (or one dropped only for being
    /// full), or fails the NIC with the address and why: it never picks another address instead.
    /// An `Err` fails this NIC alone. By default: none, the host picks.
    /// [`addresses::given_address`] reads the annotations that give a pod its address.
    fn address(
        ctx: &Context,
        nic: &Nic,
        family: IpFamily,
        order: &[u32],
    ) -> Result<Option<AddressHint>, DecisionError> {
        let _ = (ctx, nic, family, order);
        Ok(None)
    }
}

impl DecisionError {
    pub fn invalid_input(message: impl Into<String>) -> Self {
        DecisionError {
            kind: ErrorKind::InvalidInput,
            message: message.into(),
        }
    }

    pub fn not_ready(message: impl Into<String>) -> Self {
        DecisionError {
            kind: ErrorKind::NotReady,
            message: message.into(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        DecisionError {
            kind: ErrorKind::Internal,
            message: message.into(),
        }
    }
}

impl IpFamily {
    pub fn name(self) -> &'static str {
        match self {
            IpFamily::Ipv4 => "ipv4",
            IpFamily::Ipv6 => "ipv6",
        }
    }
}

/// Exports a type implementing [`Policy`] as the component's `allot:policy/policy` interface.
///
/// ```ignore
/// struct MyPolicy;
/// impl allot_policy_sdk::Policy for MyPolicy { /* ... */ }
/// allot_policy_sdk::export_policy!(MyPolicy);
/// ```
#[macro_export]
macro_rules! export_policy {
    ($policy:ty) => {
        // Component exports exist only in the wasm32 build; natively (unit tests, benchmarks)
        // the policy is a plain library and its export names would not even link.
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct __AllotPolicyExport;

            impl $crate::bindings::exports::allot::policy::policy::Guest for __AllotPolicyExport {
                fn load_inventory(inventory: $crate::types::Inventory) {
                    $crate::__runtime::load_inventory(inventory)
                }

                fn decide(
                    request: $crate::types::Request,
                ) -> ::core::result::Result<$crate::types::Decision, $crate::types::DecisionError>
                {
                    $crate::__runtime::decide::<$policy>(request)
                }
            }

            $crate::bindings::__export_guest!(__AllotPolicyExport);
        };
    };
}

#[doc(hidden)]
pub mod __runtime {
    use std::cell::RefCell;

    use crate::Policy;
    use crate::pipeline::Loaded;
    use crate::types::{Decision, DecisionError, Inventory, Request};

    thread_local! {
        static LOADED: RefCell<Option<Loaded>> = const { RefCell::new(None) };
    }

    pub fn install_panic_hook() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // The host has no stderr to show; send the panic message through the log import so the
        // host can name it in the error it reports.
        ONCE.call_once(|| {
            std::panic::set_hook(Box::new(|info| {
                crate::log::error(&format!("panic: {info}"));
            }))
        });
    }

    pub fn load_inventory(inventory: Inventory) {
        install_panic_hook();
        LOADED.with(|l| {
            let mut l = l.borrow_mut();
            let loaded = match l.take() {
                Some(previous) => previous.reload(inventory),
                None => Loaded::new(inventory),
            };
            *l = Some(loaded);
        });
    }

    pub fn decide<P: Policy>(request: Request) -> Result<Decision, DecisionError> {
        install_panic_hook();
        LOADED.with(|l| match &*l.borrow() {
            Some(loaded) => loaded.decide::<P>(&request),
            None => Err(DecisionError::internal(
                "decide was called before load-inventory",
            )),
        })
    }
}
