//! The GC decision table, row by row: every case of Spiderpool's GC documentation (its
//! `SPIDERPOOL_GC_…` settings and release times) and Calico's second sighting, and how a leak
//! then waits for its second sighting and its release time.

use allot_core::gc::{
    GcConfig, Keep, LeakReason, NotBefore, OwnerState, PodPhase, PodState, Suspects, Verdict,
    decide, endpoint_outdated,
};
use allot_core::store::{Attachment, Claim, PodRef};

const NOW: u64 = 1_000_000;
const UID: &str = "uid-1";

fn claim(name: &str, owner: Option<(&str, &str)>) -> Claim {
    Claim {
        address: "10.0.0.7".parse().unwrap(),
        pool: "p".into(),
        network: "net".into(),
        attachment: Some(Attachment {
            container_id: "c1".into(),
            interface: "eth0".into(),
        }),
        pod: PodRef {
            namespace: "team-a".into(),
            name: name.into(),
            uid: UID.into(),
            owner_kind: owner.map(|(k, _)| k.to_string()),
            owner_name: owner.map(|(_, n)| n.to_string()),
        },
        node: "node-a".into(),
        updated_at: NOW - 10_000,
    }
}

fn running() -> PodState {
    PodState {
        uid: UID.into(),
        phase: PodPhase::Running,
        deleting_at: None,
        grace: 30,
        host_network: false,
        node_ready: Some(true),
        has_pod_ips: true,
        finished_at: None,
    }
}

fn keep(why: Keep) -> Verdict {
    Verdict::Keep(why)
}

fn leak(reason: LeakReason, not_before: NotBefore) -> Verdict {
    Verdict::Leak { reason, not_before }
}

struct Row {
    case: &'static str,
    claim: Claim,
    pod: Option<PodState>,
    owner: OwnerState,
    config: GcConfig,
    expect: Verdict,
}

fn row(case: &'static str, claim: Claim, pod: Option<PodState>, expect: Verdict) -> Row {
    Row {
        case,
        claim,
        pod,
        owner: OwnerState::NotKept,
        config: GcConfig::default(),
        expect,
    }
}

impl Row {
    fn owner(mut self, s: OwnerState) -> Row {
        self.owner = s;
        self
    }
    fn config(mut self, f: impl FnOnce(&mut GcConfig)) -> Row {
        f(&mut self.config);
        self
    }
}

fn with(mut pod: PodState, f: impl FnOnce(&mut PodState)) -> Option<PodState> {
    f(&mut pod);
    Some(pod)
}

#[test]
fn the_decision_table() {
    use LeakReason::*;
    use NotBefore::*;
    let web = claim("web-7d9f-abcde", Some(("Deployment", "web")));
    let bare = claim("debug", None);
    let db1 = claim("db-1", Some(("StatefulSet", "db")));
    let db3 = claim("db-3", Some(("StatefulSet", "db")));
    let mut quarantined = claim("", None);
    quarantined.attachment = None;
    quarantined.pod = PodRef::conflict("02:00:00:00:00:01");
    let mut kept_db1 = db1.clone();
    kept_db1.attachment = None;
    let vm = claim("virt-launcher-vm1-x7k2p", Some(("VirtualMachine", "vm1")));
    let mut kept_vm = vm.clone();
    kept_vm.attachment = None;
    let terminating = |ready: Option<bool>| {
        with(running(), |p| {
            p.deleting_at = Some(NOW - 100);
            p.node_ready = ready;
        })
    };

    let rows = [
        // Deleted pods.
        row(
            "a deleted pod's claim leaks after the additional delay",
            web.clone(),
            None,
            leak(PodDeleted, AfterFirstSighting(0)),
        ),
        row(
            "the additional delay counts from the first sighting",
            bare.clone(),
            None,
            leak(PodDeleted, AfterFirstSighting(90)),
        )
        .config(|c| c.additional_grace_delay = 90),
        // Running and pending pods keep their addresses.
        row(
            "a running pod keeps its address",
            web.clone(),
            Some(running()),
            keep(Keep::InUse),
        ),
        row(
            "a pending pod keeps its address (its ADD may be in flight)",
            web.clone(),
            with(running(), |p| {
                p.phase = PodPhase::Pending;
                p.has_pod_ips = false;
            }),
            keep(Keep::InUse),
        ),
        row(
            "a pod in phase Unknown (its node lost) keeps its address",
            web.clone(),
            with(running(), |p| p.phase = PodPhase::Unknown),
            keep(Keep::InUse),
        ),
        // Running with empty status.podIPs: behind its flag, off by default.
        row(
            "running with empty podIPs is kept by default",
            web.clone(),
            with(running(), |p| p.has_pod_ips = false),
            keep(Keep::InUse),
        ),
        row(
            "running with empty podIPs leaks when the rule is on",
            web.clone(),
            with(running(), |p| p.has_pod_ips = false),
            leak(RunningWithoutPodIps, AfterFirstSighting(5)),
        )
        .config(|c| {
            c.running_on_empty_pod_ips = true;
            c.additional_grace_delay = 5;
        }),
        // Terminating stateless pods: deletionTimestamp + grace + delay, each node state
        // behind its own flag.
        row(
            "terminating on a ready node",
            web.clone(),
            terminating(Some(true)),
            leak(TerminatingOnReadyNode, At(NOW - 100 + 30)),
        ),
        row(
            "terminating on a ready node, with the additional delay",
            web.clone(),
            terminating(Some(true)),
            leak(TerminatingOnReadyNode, At(NOW - 100 + 30 + 60)),
        )
        .config(|c| c.additional_grace_delay = 60),
        row(
            "terminating on a ready node, its flag off",
            web.clone(),
            terminating(Some(true)),
            keep(Keep::Terminating),
        )
        .config(|c| c.terminating_on_ready_node = false),
        row(
            "terminating on a node that is not ready",
            web.clone(),
            terminating(Some(false)),
            leak(TerminatingOnNotReadyNode, At(NOW - 100 + 30)),
        ),
        row(
            "terminating on a node that is not ready, its flag off",
            web.clone(),
            terminating(Some(false)),
            keep(Keep::Terminating),
        )
        .config(|c| c.terminating_on_not_ready_node = false),
        row(
            "the ready-node flag does not govern not-ready nodes",
            web.clone(),
            terminating(Some(false)),
            leak(TerminatingOnNotReadyNode, At(NOW - 100 + 30)),
        )
        .config(|c| c.terminating_on_ready_node = false),
        row(
            "terminating with its node unknown counts as a ready node",
            web.clone(),
            terminating(None),
            leak(TerminatingOnReadyNode, At(NOW - 100 + 30)),
        ),
        row(
            "the pod's own grace period is used",
            web.clone(),
            with(terminating(Some(true)).unwrap(), |p| p.grace = 600),
            leak(TerminatingOnReadyNode, At(NOW - 100 + 600)),
        ),
        // Succeeded and Failed pods: finish time + grace + delay.
        row(
            "a succeeded pod",
            web.clone(),
            with(running(), |p| {
                p.phase = PodPhase::Succeeded;
                p.finished_at = Some(NOW - 5);
            }),
            leak(Finished, At(NOW - 5 + 30)),
        ),
        row(
            "a failed pod, with the additional delay",
            web.clone(),
            with(running(), |p| {
                p.phase = PodPhase::Failed;
                p.finished_at = Some(NOW - 5);
            }),
            leak(Finished, At(NOW - 5 + 30 + 7)),
        )
        .config(|c| c.additional_grace_delay = 7),
        row(
            "a finished pod without a finish time waits grace + delay from the first sighting",
            web.clone(),
            with(running(), |p| p.phase = PodPhase::Failed),
            leak(Finished, AfterFirstSighting(30)),
        ),
        row(
            "a finished pod that is also terminating is a finished pod",
            web.clone(),
            with(running(), |p| {
                p.phase = PodPhase::Succeeded;
                p.finished_at = Some(NOW - 5);
                p.deleting_at = Some(NOW);
            }),
            leak(Finished, At(NOW - 5 + 30)),
        ),
        // A record whose UID differs from the live pod's belongs to an earlier pod.
        row(
            "a claim of an earlier pod of the same name",
            web.clone(),
            with(running(), |p| p.uid = "uid-2".into()),
            leak(UidMismatch, AfterFirstSighting(0)),
        ),
        row(
            "a claim without a UID is matched by name",
            {
                let mut c = web.clone();
                c.pod.uid.clear();
                c
            },
            Some(running()),
            keep(Keep::InUse),
        ),
        // hostNetwork pods are never touched.
        row(
            "a hostNetwork pod",
            web.clone(),
            with(running(), |p| p.host_network = true),
            keep(Keep::HostNetwork),
        ),
        row(
            "a terminating hostNetwork pod",
            web.clone(),
            with(terminating(Some(false)).unwrap(), |p| p.host_network = true),
            keep(Keep::HostNetwork),
        ),
        // StatefulSets: valid pods kept, scaled-down or orphaned ones released.
        row(
            "a valid StatefulSet pod, deleted (being recreated)",
            db1.clone(),
            None,
            keep(Keep::StatefulSet),
        )
        .owner(OwnerState::Replicas(3)),
        row(
            "a valid StatefulSet pod's kept address",
            kept_db1.clone(),
            None,
            keep(Keep::StatefulSet),
        )
        .owner(OwnerState::Replicas(3)),
        row(
            "a valid StatefulSet pod recreated with a new UID",
            db1.clone(),
            with(running(), |p| {
                p.uid = "uid-2".into();
                p.phase = PodPhase::Pending;
            }),
            keep(Keep::StatefulSet),
        )
        .owner(OwnerState::Replicas(3)),
        row(
            "a valid StatefulSet pod terminating on a not-ready node",
            db1.clone(),
            terminating(Some(false)),
            keep(Keep::StatefulSet),
        )
        .owner(OwnerState::Replicas(3)),
        row(
            "a valid StatefulSet pod that failed",
            db1.clone(),
            with(running(), |p| {
                p.phase = PodPhase::Failed;
                p.finished_at = Some(NOW);
            }),
            keep(Keep::StatefulSet),
        )
        .owner(OwnerState::Replicas(3)),
        row(
            "a StatefulSet scaled below the pod's ordinal",
            db3.clone(),
            None,
            leak(StatefulSetScaledDown, AfterFirstSighting(0)),
        )
        .owner(OwnerState::Replicas(3)),
        row(
            "a StatefulSet scaled to zero",
            kept_db1.clone(),
            None,
            leak(StatefulSetScaledDown, AfterFirstSighting(0)),
        )
        .owner(OwnerState::Replicas(0)),
        row(
            "a StatefulSet that is gone",
            kept_db1.clone(),
            None,
            leak(StatefulSetGone, AfterFirstSighting(0)),
        )
        .owner(OwnerState::StatefulSetGone),
        row(
            "a scaled-down StatefulSet's pod still terminating is a terminating pod",
            db3.clone(),
            terminating(Some(true)),
            leak(TerminatingOnReadyNode, At(NOW - 100 + 30)),
        )
        .owner(OwnerState::Replicas(3)),
        row(
            "an orphaned StatefulSet pod still running keeps its address",
            db1.clone(),
            Some(running()),
            keep(Keep::InUse),
        )
        .owner(OwnerState::StatefulSetGone),
        row(
            "a pod of another set's name with a new UID is an earlier pod",
            db3.clone(),
            with(running(), |p| p.uid = "uid-2".into()),
            leak(UidMismatch, AfterFirstSighting(0)),
        )
        .owner(OwnerState::Replicas(3)),
        // Virtual machines: the address is the VM's while it exists, whatever its pods do.
        row(
            "a VM's kept address (the VM is stopped)",
            kept_vm.clone(),
            None,
            keep(Keep::VirtualMachine),
        )
        .owner(OwnerState::VirtualMachine),
        row(
            "a VM's launcher pod replaced by another (restart, migration)",
            vm.clone(),
            None,
            keep(Keep::VirtualMachine),
        )
        .owner(OwnerState::VirtualMachine),
        row(
            "a VM's launcher pod that completed (the VM shut down)",
            vm.clone(),
            with(running(), |p| {
                p.phase = PodPhase::Succeeded;
                p.finished_at = Some(NOW - 1000);
            }),
            keep(Keep::VirtualMachine),
        )
        .owner(OwnerState::VirtualMachine),
        row(
            "a VM's launcher pod terminating past its grace (an eviction's source)",
            vm.clone(),
            terminating(Some(true)),
            keep(Keep::VirtualMachine),
        )
        .owner(OwnerState::VirtualMachine),
        row(
            "a deleted VM's kept address",
            kept_vm.clone(),
            None,
            leak(VirtualMachineGone, AfterFirstSighting(0)),
        )
        .owner(OwnerState::VirtualMachineGone),
        row(
            "a deleted VM's launcher pod still terminating is a terminating pod",
            vm.clone(),
            terminating(Some(true)),
            leak(TerminatingOnReadyNode, At(NOW - 100 + 30)),
        )
        .owner(OwnerState::VirtualMachineGone),
        row(
            "a deleted VM's launcher pod still running keeps its address",
            vm.clone(),
            Some(running()),
            keep(Keep::InUse),
        )
        .owner(OwnerState::VirtualMachineGone),
        row(
            "a pod that is not a VM's is not kept by a VM's existence",
            web.clone(),
            None,
            leak(PodDeleted, AfterFirstSighting(0)),
        )
        .owner(OwnerState::VirtualMachine),
        // Never by GC.
        row(
            "a quarantined address",
            quarantined.clone(),
            None,
            keep(Keep::Quarantined),
        ),
        row(
            "a claim that names no pod",
            claim("", None),
            None,
            keep(Keep::NoPodRecorded),
        ),
        row("GC disabled", web.clone(), None, keep(Keep::Disabled)).config(|c| c.enabled = false),
    ];
    let mut failures = Vec::new();
    for r in &rows {
        let got = decide(&r.claim, r.pod.as_ref(), r.owner, &r.config);
        if got != r.expect {
            failures.push(format!("{}: expected {:?}, got {got:?}", r.case, r.expect));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_defaults_are_spiderpools() {
    let c = GcConfig::default();
    assert!(c.enabled);
    assert!(c.terminating_on_ready_node);
    assert!(c.terminating_on_not_ready_node);
    assert!(!c.running_on_empty_pod_ips);
    assert_eq!(c.additional_grace_delay, 0);
}

#[test]
fn a_leak_is_released_after_two_sightings_past_grace_and_its_own_time() {
    let c = claim("web-1", Some(("Deployment", "web")));
    let mut s = Suspects::new();
    let all = |_: &Claim| true;
    let grace = 60;
    // Terminating: may go at NOW + 300, whatever the sightings say.
    let at = NotBefore::At(NOW + 300);
    assert!(
        s.look(all, [(c.clone(), at)], NOW, grace).is_empty(),
        "first sighting"
    );
    assert!(
        s.look(all, [(c.clone(), at)], NOW + 60, grace).is_empty(),
        "before its time"
    );
    assert_eq!(
        s.look(all, [(c.clone(), at)], NOW + 300, grace),
        vec![c.clone()]
    );

    // A deleted pod with an additional delay of 120 s: 120 s after the first sighting.
    let mut s = Suspects::new();
    let later = NotBefore::AfterFirstSighting(120);
    assert!(s.look(all, [(c.clone(), later)], NOW, grace).is_empty());
    assert!(
        s.look(all, [(c.clone(), later)], NOW + 119, grace)
            .is_empty()
    );
    assert_eq!(
        s.look(all, [(c.clone(), later)], NOW + 120, grace),
        vec![c.clone()]
    );

    // A time long past still needs the second sighting, the grace period apart.
    let mut s = Suspects::new();
    let past = NotBefore::At(0);
    assert!(s.look(all, [(c.clone(), past)], NOW, grace).is_empty());
    assert!(s.look(all, [(c.clone(), past)], NOW + 59, grace).is_empty());
    assert_eq!(s.look(all, [(c.clone(), past)], NOW + 60, grace), vec![c]);
}

#[test]
fn a_look_at_one_pod_forgets_nothing_of_the_others() {
    let a = claim("a", None);
    let mut b = claim("b", None);
    b.address = "10.0.0.8".parse().unwrap();
    let mut s = Suspects::new();
    let now = NotBefore::AfterFirstSighting(0);
    s.look(|_| true, [(a.clone(), now), (b.clone(), now)], NOW, 60);
    // b's pod came back: a look at b alone finds it in use.
    let only_b = |c: &Claim| c.pod.name == "b";
    assert!(s.look(only_b, [], NOW + 10, 60).is_empty());
    assert_eq!(s.len(), 1, "a is still a suspect");
    assert_eq!(s.look(|_| true, [(a.clone(), now)], NOW + 60, 60), vec![a]);
}

#[test]
fn outdated_endpoints() {
    assert!(
        endpoint_outdated("u1", None, false),
        "pod gone, nothing held"
    );
    assert!(
        endpoint_outdated("u1", Some("u2"), false),
        "an earlier pod's"
    );
    assert!(
        !endpoint_outdated("u1", Some("u1"), false),
        "the live pod's"
    );
    assert!(
        !endpoint_outdated("u1", None, true),
        "a kept StatefulSet address"
    );
}
