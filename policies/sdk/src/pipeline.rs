//! The three-stage pipeline shared by every policy.

use crate::Policy;
use std::cell::RefCell;

use crate::context::{Context, Index, Known, Memo};
use crate::types::{
    AcquisitionRule, Decision, DecisionError, DropReason, Dropped, FamilyDecision, Inventory,
    IpFamily, NicDecision, PoolRef, Request, Route,
};

/// What [`Policy::acquire`] found for one NIC.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Acquisition {
    /// Fails this NIC alone, with this error (e.g. the pod names a pool that does not exist);
    /// the request's other NICs are still decided, and the fields below are ignored. An `Err`
    /// from [`Policy::acquire`] instead fails the whole request.
    pub error: Option<DecisionError>,
    pub clean_gateway: bool,
    pub routes: Vec<Route>,
    /// One entry per IP family the NIC should get an address of.
    pub families: Vec<FamilyCandidates>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FamilyCandidates {
    pub family: IpFamily,
    pub rule: AcquisitionRule,
    /// Where the rule read its pools from, for people reading a trace.
    pub source: String,
    pub candidates: Vec<u32>,
    /// Names that matched nothing (reported as dropped `not-found`).
    pub missing: Vec<Dropped>,
}

impl Acquisition {
    /// An acquisition that fails the NIC with `error`.
    pub fn failed(error: DecisionError) -> Self {
        Acquisition {
            error: Some(error),
            ..Default::default()
        }
    }
}

/// Why [`Policy::filter`] dropped a pool.
#[derive(Clone, Debug, PartialEq)]
pub struct Rejection {
    pub reason: DropReason,
    pub detail: String,
}

impl Rejection {
    /// A standard reason without detail: the host describes it from the pool and the request
    /// when the trace is read (an error, `allotctl policy explain`), so deciding formats nothing.
    pub fn standard(reason: DropReason) -> Self {
        Rejection {
            reason,
            detail: String::new(),
        }
    }

    /// A reason with the policy's own explanation (use it for `DropReason::Other`).
    pub fn new(reason: DropReason, detail: impl Into<String>) -> Self {
        Rejection {
            reason,
            detail: detail.into(),
        }
    }
}

/// An inventory with its lookups: what a policy instance holds between calls.
pub struct Loaded {
    inventory: Inventory,
    index: Index,
    memo: RefCell<Memo>,
    known: RefCell<Known>,
}

impl Loaded {
    pub fn new(inventory: Inventory) -> Self {
        let index = Index::new(&inventory);
        Loaded {
            inventory,
            index,
            memo: RefCell::default(),
            known: RefCell::default(),
        }
    }

    /// `inventory` loaded in place of this one's: the namespace and node last sent stay known
    /// (a 0.3.0 host does not send them again after a new inventory).
    pub fn reload(self, inventory: Inventory) -> Self {
        Loaded {
            known: self.known,
            ..Loaded::new(inventory)
        }
    }

    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// Runs acquire → filter → sort → address for every NIC of the request.
    pub fn decide<P: Policy>(&self, request: &Request) -> Result<Decision, DecisionError> {
        // First: what the request sends is known from now on, whatever the answer.
        self.memo.borrow_mut().prepare(
            &mut self.known.borrow_mut(),
            request,
            self.inventory.pools.len(),
        )?;
        if request.inventory_generation != self.inventory.generation {
            return Err(DecisionError::internal(format!(
                "request is for inventory generation {} but generation {} is loaded",
                request.inventory_generation, self.inventory.generation
            )));
        }
        let known = self.known.borrow();
        let (Some(namespace), Some(node)) = (&known.namespace, &known.node) else {
            unreachable!("prepare checked that both are known")
        };
        let ctx = Context {
            inventory: &self.inventory,
            request,
            namespace,
            node,
            index: &self.index,
            memo: &self.memo,
        };
        let mut nics = Vec::with_capacity(request.nics.len());
        for nic in &request.nics {
            let acquisition = P::acquire(&ctx, nic)?;
            if let Some(error) = acquisition.error {
                nics.push(NicDecision {
                    interface: nic.interface.clone(),
                    error: Some(error),
                    clean_gateway: false,
                    routes: Vec::new(),
                    families: Vec::new(),
                });
                continue;
            }
            let mut families = Vec::with_capacity(acquisition.families.len());
            let mut failed = None;
            for fam in acquisition.families {
                let mut order = Vec::with_capacity(fam.candidates.len());
                let mut dropped = fam.missing;
                for &i in &fam.candidates {
                    match P::filter(&ctx, nic, fam.family, i) {
                        Ok(()) => order.push(i),
                        Err(r) => dropped.push(Dropped {
                            pool: PoolRef::Index(i),
                            reason: r.reason,
                            detail: r.detail,
                        }),
                    }
                }
                P::sort(&ctx, nic, fam.family, &mut order);
                let address = match P::address(&ctx, nic, fam.family, &order) {
                    Ok(address) => address,
                    Err(error) => {
                        failed = Some(error);
                        break;
                    }
                };
                families.push(FamilyDecision {
                    family: fam.family,
                    rule: fam.rule,
                    source: fam.source,
                    candidates: fam.candidates,
                    order,
                    dropped,
                    address,
                });
            }
            if let Some(error) = failed {
                nics.push(NicDecision {
                    interface: nic.interface.clone(),
                    error: Some(error),
                    clean_gateway: false,
                    routes: Vec::new(),
                    families: Vec::new(),
                });
                continue;
            }
            nics.push(NicDecision {
                interface: nic.interface.clone(),
                error: None,
                clean_gateway: acquisition.clean_gateway,
                routes: acquisition.routes,
                families,
            });
        }
        Ok(Decision { nics })
    }
}
