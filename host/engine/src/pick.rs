//! Choosing the address of each family: the next free one of the first pool of the order with
//! room, or the one the policy names ([`crate::given`]).

use std::fmt::Write as _;
use std::net::IpAddr;

use allot_core::policy::{
    AddressHint, FamilyDecision, Inventory, Policy, PolicyErrorKind, PoolRef, Request,
    describe_drop,
};
use allot_core::store::Store;

use crate::{AllocError, Engine, given, lock};

impl<S: Store, P: Policy> Engine<S, P> {
    /// The error for a given `address` that someone else holds: try again later, naming the
    /// holder.
    pub(super) fn given_held(
        &self,
        interface: &str,
        hint: &AddressHint,
        address: IpAddr,
    ) -> AllocError {
        let why = match self.store.all() {
            Ok(claims) => given::holder(&claims, address),
            Err(e) => format!("it is held by someone else (reading who failed: {e})"),
        };
        given::refused(PolicyErrorKind::NotReady, interface, hint, address, &why)
    }

    /// Takes one free address per family from the first pool of its order with room: an
    /// address that is not cooling down if any pool of the order has one, else the one released
    /// longest ago of the first pool that has any (counted in
    /// [`PoolUsage::cooldown_cut_short`]). A cooldown prefers, it never refuses. A family whose
    /// decision names an address gets that address or fails ([`given`]): an error the policy
    /// could have returned, so the plugin reports it as one (invalid pod, or try again later
    /// while someone else holds the address). Before any of that, the address this pod's NIC
    /// released last on `network`, if it is free (cooling or not) in a pool of the order: a
    /// retried sandbox keeps its address ([`crate::returning`]).
    pub(super) fn pick(
        &self,
        inventory: &Inventory,
        request: &Request,
        network: &str,
        interface: &str,
        families: &[&FamilyDecision],
    ) -> Result<Vec<(IpAddr, String)>, AllocError> {
        let now = self.now();
        let returned: Vec<Option<IpAddr>> = {
            let returning = lock(&self.returning);
            families
                .iter()
                .map(|f| returning.last(&request.pod.uid, network, interface, f.family, now))
                .collect()
        };
        let mut state = self.state();
        let mut picks: Vec<(IpAddr, String)> = Vec::with_capacity(families.len());
        for (fam, returned) in families.iter().zip(returned) {
            if let Some(hint) = &fam.address {
                let address = hint.ip().expect("Decision::validate parsed the address");
                match state.take_given(inventory, request, interface, fam, address) {
                    Ok(pool) => {
                        picks.push((address, pool));
                        continue;
                    }
                    Err(refusal) => {
                        for (addr, _) in &picks {
                            state.untake(*addr, false);
                        }
                        drop(state);
                        return Err(match refusal {
                            given::Refusal::Never(why) => given::refused(
                                PolicyErrorKind::InvalidInput,
                                interface,
                                hint,
                                address,
                                &why,
                            ),
                            given::Refusal::Held => self.given_held(interface, hint, address),
                        });
                    }
                }
            }
            // The inventory may have been replaced since the decision: go by name, and skip a
            // pool that has since been disabled or marked for deletion.
            let serving: Vec<(usize, &String)> = fam
                .order
                .iter()
                .map(|&i| &inventory.pools[i as usize].name)
                .filter_map(|name| {
                    let &entry = state.by_name.get(name)?;
                    let pool = &state.pools[entry].pool;
                    let takes = !pool.spec.disable && !pool.terminating();
                    (takes && pool.family == fam.family).then_some((entry, name))
                })
                .collect();
            // Never one a ReservedIP has since taken out of the pool.
            if let Some(address) = returned
                && !state.reserved.iter().any(|r| r.reserves_address(address))
                && let Some(&(entry, name)) = serving
                    .iter()
                    .find(|&&(entry, _)| state.locate(address) == Some(entry))
                && (state.take_cooling_exact(entry, address) || state.take_exact(address))
            {
                picks.push((address, name.clone()));
                continue;
            }
            let mut got = serving
                .iter()
                .find_map(|&(entry, name)| Some((state.take(entry)?, name.clone())));
            if got.is_none() {
                got = serving
                    .iter()
                    .find_map(|&(entry, name)| Some((state.take_cooling(entry)?, name.clone())));
                if let Some((_, name)) = &got {
                    *lock(&self.cut_short).entry(name.clone()).or_default() += 1;
                }
            }
            match got {
                Some(p) => picks.push(p),
                None => {
                    for (addr, _) in &picks {
                        state.untake(*addr, false);
                    }
                    return Err(no_pool_fits(inventory, request, interface, fam));
                }
            }
        }
        Ok(picks)
    }
}

fn no_pool_fits(
    inventory: &Inventory,
    request: &Request,
    interface: &str,
    fam: &FamilyDecision,
) -> AllocError {
    let name = |i: u32| inventory.pools[i as usize].name.as_str();
    let mut trace = String::new();
    let _ = writeln!(
        trace,
        "{interface} {}: rule {} ({})",
        fam.family, fam.rule, fam.source
    );
    let candidates: Vec<&str> = fam.candidates.iter().map(|&i| name(i)).collect();
    let _ = writeln!(trace, "candidates: {}", candidates.join(", "));
    let mut reasons = Vec::new();
    for d in &fam.dropped {
        let pool = match &d.pool {
            PoolRef::Index(i) => name(*i).to_string(),
            PoolRef::Missing(n) => n.clone(),
        };
        let why = describe_drop(inventory, request, interface, d);
        let _ = writeln!(trace, "dropped {pool}: {} ({why})", d.reason);
        reasons.push(format!("{pool} {}", d.reason));
    }
    for &i in &fam.order {
        let _ = writeln!(trace, "{}: no free address left", name(i));
        reasons.push(format!("{} exhausted", name(i)));
    }
    let summary = if reasons.is_empty() {
        "the policy named no candidate pool".to_string()
    } else {
        format!(
            "{} considered: {}",
            candidates.len().max(reasons.len()),
            reasons.join(", ")
        )
    };
    AllocError::NoPoolFits {
        family: fam.family,
        interface: interface.to_string(),
        summary,
        trace,
    }
}
