//! The GC decision table: whether the cluster still needs the address a claim holds.
//!
//! Spiderpool's rules (its `SPIDERPOOL_GC_…` settings, under allot's names `ALLOT_GC_…`), with
//! Calico's caution on top: [`decide`] only says *leaked, and not before when*; the caller
//! releases a leak after it saw it twice, past a grace period ([`Suspects`](super::Suspects)),
//! and after reading the pod again from the API just before the release.
//!
//! | the cluster says | decision |
//! |---|---|
//! | GC disabled | keep |
//! | the address is quarantined (a foreign host answered for it) | keep (it expires on its own) |
//! | the claim names no pod | keep (nothing to judge it by) |
//! | pod gone, its StatefulSet exists and the ordinal is below `replicas` | keep (the pod comes back) |
//! | pod gone, its StatefulSet is gone | leak (`statefulset-gone`) |
//! | pod gone, its StatefulSet was scaled below the ordinal | leak (`statefulset-scaled-down`) |
//! | a virtual machine's launcher pod (gone, replaced, finished or terminating), the VM or an instance of it exists | keep (its next launcher pod, or a live migration's target, holds it) |
//! | pod gone, its virtual machine is gone | leak (`virtualmachine-gone`) |
//! | pod gone (any other) | leak (`pod-deleted`), after the additional delay |
//! | a pod of that name with another UID, a valid StatefulSet's | keep (the new pod takes it back) |
//! | a pod of that name with another UID (any other) | leak (`uid-mismatch`), after the additional delay |
//! | hostNetwork pod | keep (it never used the address; allot never touches it) |
//! | a valid StatefulSet's pod, whatever its phase | keep |
//! | Succeeded or Failed | leak (`finished`) at finish time + grace + additional delay |
//! | terminating on a ready node, `…_STATELESS_TERMINATING_POD_ON_READY_NODE_ENABLED` | leak (`terminating-on-ready-node`) at deletionTimestamp + grace + additional delay |
//! | terminating on a not-ready node, `…_STATELESS_TERMINATING_POD_ON_NOT_READY_NODE_ENABLED` | leak (`terminating-on-not-ready-node`) at the same time |
//! | terminating, the flag for its node's state off | keep |
//! | Running with empty `status.podIPs`, `…_ENABLE_STATELESS_RUNNING_POD_ON_EMPTY_POD_STATUS_IPS` | leak (`running-without-pod-ips`), after the additional delay |
//! | Pending, Running, Unknown | keep (in use) |
//!
//! Claims are matched to pods by namespace and name (and then UID): a pod of the same name in
//! another namespace is another pod.

use crate::store::Claim;

use super::scaled_away;

/// The settings of the decision, with Spiderpool's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcConfig {
    /// `ALLOT_GC_IP_ENABLED` (true): off, nothing is ever released by GC.
    pub enabled: bool,
    /// `ALLOT_GC_STATELESS_TERMINATING_POD_ON_READY_NODE_ENABLED` (true).
    pub terminating_on_ready_node: bool,
    /// `ALLOT_GC_STATELESS_TERMINATING_POD_ON_NOT_READY_NODE_ENABLED` (true).
    pub terminating_on_not_ready_node: bool,
    /// `ALLOT_GC_ENABLE_STATELESS_RUNNING_POD_ON_EMPTY_POD_STATUS_IPS` (false).
    pub running_on_empty_pod_ips: bool,
    /// `ALLOT_GC_ADDITIONAL_GRACE_DELAY` (0 s): added to every release time.
    pub additional_grace_delay: u64,
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            enabled: true,
            terminating_on_ready_node: true,
            terminating_on_not_ready_node: true,
            running_on_empty_pod_ips: false,
            additional_grace_delay: 0,
        }
    }
}

/// A pod's phase (`status.phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl PodPhase {
    /// From `status.phase`; anything unknown (or absent) is `Unknown`, which is kept.
    pub fn parse(phase: Option<&str>) -> PodPhase {
        match phase {
            Some("Pending") => PodPhase::Pending,
            Some("Running") => PodPhase::Running,
            Some("Succeeded") => PodPhase::Succeeded,
            Some("Failed") => PodPhase::Failed,
            _ => PodPhase::Unknown,
        }
    }
}

/// What the cluster says about the pod of the claim's namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodState {
    pub uid: String,
    pub phase: PodPhase,
    /// `metadata.deletionTimestamp`, unix seconds: the pod is terminating.
    pub deleting_at: Option<u64>,
    /// The grace period it terminates with: `metadata.deletionGracePeriodSeconds` while
    /// terminating, else `spec.terminationGracePeriodSeconds` (30 when unset).
    pub grace: u64,
    pub host_network: bool,
    /// Whether its node is Ready; `None` when it has no node or the node is unknown (then it
    /// counts as ready: the not-ready rule is for nodes known to be down).
    pub node_ready: Option<bool>,
    /// `status.podIPs` is not empty.
    pub has_pod_ips: bool,
    /// When its last container finished (unix seconds), for Succeeded and Failed pods.
    pub finished_at: Option<u64>,
}

/// What the decision knows about the owner that keeps the claim's address between pods (the
/// claim records its owner): a StatefulSet, a KubeVirt virtual machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerState {
    /// The claim was made for a pod whose owner keeps no address between pods.
    NotKept,
    /// A StatefulSet's pod: the StatefulSet does not exist.
    StatefulSetGone,
    /// A StatefulSet's pod: the StatefulSet exists with this many replicas.
    Replicas(u32),
    /// A virtual machine's launcher pod: the VirtualMachine (or its VirtualMachineInstance)
    /// exists, or whether it does is not known yet (KubeVirt's kinds not listed).
    VirtualMachine,
    /// A virtual machine's launcher pod: neither the VirtualMachine nor an instance of it
    /// exists (or KubeVirt is not installed).
    VirtualMachineGone,
}

/// Why a claim is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Keep {
    Disabled,
    Quarantined,
    NoPodRecorded,
    /// A valid StatefulSet pod: the set exists and the ordinal is below its replicas.
    StatefulSet,
    /// A virtual machine's address: the VM exists (its next launcher pod takes it back).
    VirtualMachine,
    HostNetwork,
    /// Terminating, but GC of terminating pods on this node's state is off.
    Terminating,
    /// Pending, Running or Unknown (Running without pod IPs too, unless that rule is on).
    InUse,
}

/// Why a claim is leaked: the label of `allot_gc_released_total{reason}` and of the Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LeakReason {
    PodDeleted,
    UidMismatch,
    Finished,
    TerminatingOnReadyNode,
    TerminatingOnNotReadyNode,
    RunningWithoutPodIps,
    StatefulSetGone,
    StatefulSetScaledDown,
    VirtualMachineGone,
}

impl LeakReason {
    pub const ALL: [LeakReason; 9] = [
        LeakReason::PodDeleted,
        LeakReason::UidMismatch,
        LeakReason::Finished,
        LeakReason::TerminatingOnReadyNode,
        LeakReason::TerminatingOnNotReadyNode,
        LeakReason::RunningWithoutPodIps,
        LeakReason::StatefulSetGone,
        LeakReason::StatefulSetScaledDown,
        LeakReason::VirtualMachineGone,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LeakReason::PodDeleted => "pod-deleted",
            LeakReason::UidMismatch => "uid-mismatch",
            LeakReason::Finished => "finished",
            LeakReason::TerminatingOnReadyNode => "terminating-on-ready-node",
            LeakReason::TerminatingOnNotReadyNode => "terminating-on-not-ready-node",
            LeakReason::RunningWithoutPodIps => "running-without-pod-ips",
            LeakReason::StatefulSetGone => "statefulset-gone",
            LeakReason::StatefulSetScaledDown => "statefulset-scaled-down",
            LeakReason::VirtualMachineGone => "virtualmachine-gone",
        }
    }

    /// The sentence a person reads (`allotctl gc --dry-run`, Events).
    pub fn describe(self) -> &'static str {
        match self {
            LeakReason::PodDeleted => "the pod no longer exists",
            LeakReason::UidMismatch => {
                "a pod of that name exists, but with another UID: the claim is an earlier pod's"
            }
            LeakReason::Finished => "the pod has finished (Succeeded or Failed)",
            LeakReason::TerminatingOnReadyNode => {
                "the pod has been terminating past its grace period on a ready node"
            }
            LeakReason::TerminatingOnNotReadyNode => {
                "the pod has been terminating past its grace period on a node that is not ready"
            }
            LeakReason::RunningWithoutPodIps => "the pod is running with empty status.podIPs",
            LeakReason::StatefulSetGone => "the pod and its StatefulSet no longer exist",
            LeakReason::StatefulSetScaledDown => {
                "the pod no longer exists and its StatefulSet was scaled below its ordinal"
            }
            LeakReason::VirtualMachineGone => {
                "the launcher pod and its virtual machine (VirtualMachine and instance) no longer \
                 exist"
            }
        }
    }
}

/// From when a leak may be released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotBefore {
    /// From this unix time on (known from the pod: deletionTimestamp or finish time, plus
    /// grace and delay).
    At(u64),
    /// This many seconds after the leak was first seen (the cluster does not say when it began:
    /// a pod that is gone).
    AfterFirstSighting(u64),
}

/// The decision on one claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Keep(Keep),
    Leak {
        reason: LeakReason,
        not_before: NotBefore,
    },
}

impl Verdict {
    pub fn is_leak(&self) -> bool {
        matches!(self, Verdict::Leak { .. })
    }
}

/// The decision table (see the module's documentation). `pod` is what the cluster says about
/// the pod of `claim`'s namespace and name (`None`: no such pod); `owner_state` what it says
/// about the claim's StatefulSet or virtual machine.
pub fn decide(
    claim: &Claim,
    pod: Option<&PodState>,
    owner_state: OwnerState,
    config: &GcConfig,
) -> Verdict {
    if !config.enabled {
        return Verdict::Keep(Keep::Disabled);
    }
    if claim.is_quarantined() {
        return Verdict::Keep(Keep::Quarantined);
    }
    if claim.pod.name.is_empty() {
        return Verdict::Keep(Keep::NoPodRecorded);
    }
    let delay = config.additional_grace_delay;
    let leak = |reason, not_before| Verdict::Leak { reason, not_before };
    let after_first_sighting = |reason| leak(reason, NotBefore::AfterFirstSighting(delay));
    let owner = claim.pod.owner_name.as_deref().unwrap_or("");
    // The owner keeps the address whatever became of the pod.
    let kept_by_owner = match owner_state {
        OwnerState::Replicas(n) if !scaled_away(&claim.pod.name, owner, n) => {
            Some(Keep::StatefulSet)
        }
        OwnerState::VirtualMachine if claim.pod.virtual_machine().is_some() => {
            Some(Keep::VirtualMachine)
        }
        _ => None,
    };

    let Some(pod) = pod else {
        if let Some(keep) = kept_by_owner {
            return Verdict::Keep(keep);
        }
        return match owner_state {
            OwnerState::StatefulSetGone => after_first_sighting(LeakReason::StatefulSetGone),
            OwnerState::Replicas(_) => after_first_sighting(LeakReason::StatefulSetScaledDown),
            OwnerState::VirtualMachineGone => after_first_sighting(LeakReason::VirtualMachineGone),
            OwnerState::NotKept | OwnerState::VirtualMachine => {
                after_first_sighting(LeakReason::PodDeleted)
            }
        };
    };
    let same_pod = claim.pod.uid.is_empty() || pod.uid.is_empty() || claim.pod.uid == pod.uid;
    if !same_pod {
        return match kept_by_owner {
            Some(keep) => Verdict::Keep(keep),
            None => after_first_sighting(LeakReason::UidMismatch),
        };
    }
    if pod.host_network {
        return Verdict::Keep(Keep::HostNetwork);
    }
    if let Some(keep) = kept_by_owner {
        return Verdict::Keep(keep);
    }
    match pod.phase {
        PodPhase::Succeeded | PodPhase::Failed => {
            let wait = pod.grace.saturating_add(delay);
            let not_before = match pod.finished_at {
                Some(t) => NotBefore::At(t.saturating_add(wait)),
                None => NotBefore::AfterFirstSighting(wait),
            };
            return leak(LeakReason::Finished, not_before);
        }
        _ if pod.deleting_at.is_some() => {}
        PodPhase::Running if !pod.has_pod_ips && config.running_on_empty_pod_ips => {
            return after_first_sighting(LeakReason::RunningWithoutPodIps);
        }
        _ => return Verdict::Keep(Keep::InUse),
    }
    let deleting_at = pod.deleting_at.unwrap_or_default();
    let (reason, enabled) = if pod.node_ready == Some(false) {
        (
            LeakReason::TerminatingOnNotReadyNode,
            config.terminating_on_not_ready_node,
        )
    } else {
        (
            LeakReason::TerminatingOnReadyNode,
            config.terminating_on_ready_node,
        )
    };
    if !enabled {
        return Verdict::Keep(Keep::Terminating);
    }
    let at = deleting_at.saturating_add(pod.grace).saturating_add(delay);
    leak(reason, NotBefore::At(at))
}

/// Whether an allot `Endpoint` is outdated (`ALLOT_GC_CLEAN_OUTDATED_ENDPOINT`, off by
/// default): no claim holds an address for it any more, and no live pod of its name has its
/// UID (a live pod's Endpoint is the agent's to keep).
pub fn endpoint_outdated(
    endpoint_uid: &str,
    live_pod_uid: Option<&str>,
    holds_claims: bool,
) -> bool {
    !holds_claims && live_pod_uid != Some(endpoint_uid)
}
