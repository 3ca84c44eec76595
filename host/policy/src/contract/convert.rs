//! Conversions between allot-core's policy types and the WIT bindings of each contract version
//! (the parent module's, which alone uses them). The versions share most types (0.2.0 changed
//! the NIC decision, 0.3.0 the request and the family decision), so one macro writes the shared
//! conversions into a module per version.

use allot_core::IpFamily;
use allot_core::policy::{self as core, Labels};
use allot_core::spec::{LabelSelector, RouteSpec, SelectorOperator};
use allot_core::{PolicyError, PolicyErrorKind};

macro_rules! shared_conversions {
    () => {
        fn family(f: IpFamily) -> wit::IpFamily {
            match f {
                IpFamily::V4 => wit::IpFamily::Ipv4,
                IpFamily::V6 => wit::IpFamily::Ipv6,
            }
        }

        fn family_back(f: wit::IpFamily) -> IpFamily {
            match f {
                wit::IpFamily::Ipv4 => IpFamily::V4,
                wit::IpFamily::Ipv6 => IpFamily::V6,
            }
        }

        fn labels(l: &Labels) -> Vec<wit::Label> {
            l.iter()
                .map(|(k, v)| wit::Label {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect()
        }

        fn selector(s: &LabelSelector) -> wit::LabelSelector {
            wit::LabelSelector {
                match_labels: labels(&s.match_labels),
                match_expressions: s
                    .match_expressions
                    .iter()
                    .map(|r| wit::SelectorRequirement {
                        key: r.key.clone(),
                        operator: match r.operator {
                            SelectorOperator::In => wit::SelectorOperator::In,
                            SelectorOperator::NotIn => wit::SelectorOperator::NotIn,
                            SelectorOperator::Exists => wit::SelectorOperator::Exists,
                            SelectorOperator::DoesNotExist => wit::SelectorOperator::DoesNotExist,
                        },
                        values: r.values.clone(),
                    })
                    .collect(),
            }
        }

        fn routes(r: &[RouteSpec]) -> Vec<wit::Route> {
            r.iter()
                .map(|r| wit::Route {
                    dst: r.dst.clone(),
                    gw: r.gw.clone(),
                })
                .collect()
        }

        pub(crate) fn inventory(inv: &core::Inventory) -> wit::Inventory {
            wit::Inventory {
                generation: inv.generation,
                pools: inv
                    .pools
                    .iter()
                    .map(|p| wit::Pool {
                        name: p.name.clone(),
                        labels: labels(&p.labels),
                        ip_version: family(p.family),
                        subnet: p.spec.subnet.clone(),
                        ips: p.spec.ips.clone(),
                        exclude_ips: p.spec.exclude_ips.clone(),
                        gateway: p.spec.gateway.clone(),
                        routes: routes(&p.spec.routes),
                        pod_affinity: p.spec.pod_affinity.as_ref().map(selector),
                        namespace_affinity: p.spec.namespace_affinity.as_ref().map(selector),
                        node_affinity: p.spec.node_affinity.as_ref().map(selector),
                        namespace_name: p.spec.namespace_name.clone(),
                        node_name: p.spec.node_name.clone(),
                        multus_name: p.spec.multus_name.clone(),
                        default: p.spec.default,
                        disable: p.spec.disable,
                        terminating: p.terminating,
                        total_count: p.total_count,
                        all_excluded: p.all_excluded,
                        all_reserved: p.all_reserved,
                        subnet_owner: p.subnet_owner.clone(),
                        application: p.application.as_ref().map(|a| wit::Application {
                            kind: a.kind.clone(),
                            namespace: a.namespace.clone(),
                            name: a.name.clone(),
                        }),
                    })
                    .collect(),
                subnets: inv
                    .subnets
                    .iter()
                    .map(|s| wit::Subnet {
                        name: s.name.clone(),
                        ip_version: family(s.family),
                        subnet: s.spec.subnet.clone(),
                        ips: s.spec.ips.clone(),
                        exclude_ips: s.spec.exclude_ips.clone(),
                        gateway: s.spec.gateway.clone(),
                        routes: routes(&s.spec.routes),
                    })
                    .collect(),
            }
        }

        fn pod(p: &core::PodInfo) -> wit::Pod {
            wit::Pod {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                uid: p.uid.clone(),
                labels: labels(&p.labels),
                annotations: labels(&p.annotations),
                owner: p.owner.as_ref().map(|o| wit::Owner {
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                }),
            }
        }

        fn namespace(n: &core::NamespaceInfo) -> wit::Namespace {
            wit::Namespace {
                name: n.name.clone(),
                labels: labels(&n.labels),
                annotations: labels(&n.annotations),
            }
        }

        fn node(n: &core::NodeInfo) -> wit::Node {
            wit::Node {
                name: n.name.clone(),
                labels: labels(&n.labels),
            }
        }

        fn nics(r: &core::Request) -> Vec<wit::Nic> {
            r.nics
                .iter()
                .map(|n| wit::Nic {
                    interface: n.interface.clone(),
                    multus_name: n.multus_name.clone(),
                })
                .collect()
        }

        fn cni_defaults(r: &core::Request) -> wit::CniDefaults {
            wit::CniDefaults {
                ipv4: r.cni_defaults.ipv4.clone(),
                ipv6: r.cni_defaults.ipv6.clone(),
            }
        }

        fn rule(r: wit::AcquisitionRule) -> core::AcquisitionRule {
            match r {
                wit::AcquisitionRule::SubnetAnnotation => core::AcquisitionRule::SubnetAnnotation,
                wit::AcquisitionRule::PoolAnnotation => core::AcquisitionRule::PoolAnnotation,
                wit::AcquisitionRule::NamespaceDefault => core::AcquisitionRule::NamespaceDefault,
                wit::AcquisitionRule::CniDefault => core::AcquisitionRule::CniDefault,
                wit::AcquisitionRule::ClusterDefault => core::AcquisitionRule::ClusterDefault,
                wit::AcquisitionRule::Custom => core::AcquisitionRule::Custom,
            }
        }

        fn reason(r: wit::DropReason) -> core::DropReason {
            use allot_core::policy::DropReason as D;
            match r {
                wit::DropReason::NotFound => D::NotFound,
                wit::DropReason::Terminating => D::Terminating,
                wit::DropReason::Disabled => D::Disabled,
                wit::DropReason::WrongFamily => D::WrongFamily,
                wit::DropReason::NodeMismatch => D::NodeMismatch,
                wit::DropReason::NamespaceMismatch => D::NamespaceMismatch,
                wit::DropReason::PodMismatch => D::PodMismatch,
                wit::DropReason::MultusMismatch => D::MultusMismatch,
                wit::DropReason::AllExcluded => D::AllExcluded,
                wit::DropReason::AllReserved => D::AllReserved,
                wit::DropReason::Exhausted => D::Exhausted,
                wit::DropReason::Other => D::Other,
            }
        }

        pub(crate) fn decision_error(e: wit::DecisionError) -> PolicyError {
            let kind = match e.kind {
                wit::ErrorKind::InvalidInput => PolicyErrorKind::InvalidInput,
                wit::ErrorKind::NotReady => PolicyErrorKind::NotReady,
                wit::ErrorKind::Internal => PolicyErrorKind::Internal,
            };
            // The message is the policy's; bound it like any other output.
            let mut message = e.message;
            if message.len() > allot_core::policy::MAX_DETAIL_BYTES {
                message.truncate(message.floor_char_boundary(allot_core::policy::MAX_DETAIL_BYTES));
                message.push('…');
            }
            PolicyError::new(kind, message)
        }

        fn family_decision(f: wit::FamilyDecision) -> core::FamilyDecision {
            core::FamilyDecision {
                family: family_back(f.family),
                rule: rule(f.rule),
                source: f.source,
                candidates: f.candidates,
                order: f.order,
                dropped: f
                    .dropped
                    .into_iter()
                    .map(|d| core::Dropped {
                        pool: match d.pool {
                            wit::PoolRef::Index(i) => core::PoolRef::Index(i),
                            wit::PoolRef::Missing(name) => core::PoolRef::Missing(name),
                        },
                        reason: reason(d.reason),
                        detail: d.detail,
                    })
                    .collect(),
                address: None,
            }
        }

        fn routes_back(r: Vec<wit::Route>) -> Vec<RouteSpec> {
            r.into_iter()
                .map(|r| RouteSpec {
                    dst: r.dst,
                    gw: r.gw,
                })
                .collect()
        }
    };
}

pub(crate) mod v0_1 {
    use super::*;
    use crate::contract::v0_1::allot::policy::types as wit;

    shared_conversions!();

    /// Before 0.3.0 every request carries the namespace and the node.
    pub(crate) fn request(generation: u64, r: &core::Request) -> wit::Request {
        wit::Request {
            inventory_generation: generation,
            pod: pod(&r.pod),
            namespace: namespace(&r.namespace),
            node: node(&r.node),
            nics: nics(r),
            cni_defaults: cni_defaults(r),
            free_counts: r.free_counts.clone(),
        }
    }

    pub(crate) fn decision(d: wit::Decision) -> core::Decision {
        core::Decision {
            nics: d
                .nics
                .into_iter()
                .map(|n| core::NicDecision {
                    interface: n.interface,
                    // 0.1.0 can only fail the whole request.
                    error: None,
                    clean_gateway: n.clean_gateway,
                    routes: routes_back(n.routes),
                    families: n.families.into_iter().map(family_decision).collect(),
                })
                .collect(),
        }
    }
}

pub(crate) mod v0_2 {
    use super::*;
    use crate::contract::v0_2::allot::policy::types as wit;

    shared_conversions!();

    /// Before 0.3.0 every request carries the namespace and the node.
    pub(crate) fn request(generation: u64, r: &core::Request) -> wit::Request {
        wit::Request {
            inventory_generation: generation,
            pod: pod(&r.pod),
            namespace: namespace(&r.namespace),
            node: node(&r.node),
            nics: nics(r),
            cni_defaults: cni_defaults(r),
            free_counts: r.free_counts.clone(),
        }
    }

    pub(crate) fn decision(d: wit::Decision) -> core::Decision {
        core::Decision {
            nics: d
                .nics
                .into_iter()
                .map(|n| core::NicDecision {
                    interface: n.interface,
                    error: n.error.map(decision_error),
                    clean_gateway: n.clean_gateway,
                    routes: routes_back(n.routes),
                    families: n.families.into_iter().map(family_decision).collect(),
                })
                .collect(),
        }
    }
}

pub(crate) mod v0_3 {
    use super::*;
    use crate::contract::v0_3::allot::policy::types as wit;

    shared_conversions!();

    /// The namespace and node go along only when `send_namespace` / `send_node`: the instance
    /// keeps the last ones it was sent.
    pub(crate) fn request(
        generation: u64,
        r: &core::Request,
        send_namespace: bool,
        send_node: bool,
    ) -> wit::Request {
        wit::Request {
            inventory_generation: generation,
            pod: pod(&r.pod),
            namespace: send_namespace.then(|| namespace(&r.namespace)),
            node: send_node.then(|| node(&r.node)),
            nics: nics(r),
            cni_defaults: cni_defaults(r),
            free_counts: r.free_counts.clone(),
        }
    }

    pub(crate) fn decision(d: wit::Decision) -> core::Decision {
        core::Decision {
            nics: d
                .nics
                .into_iter()
                .map(|n| core::NicDecision {
                    interface: n.interface,
                    error: n.error.map(decision_error),
                    clean_gateway: n.clean_gateway,
                    routes: routes_back(n.routes),
                    families: n
                        .families
                        .into_iter()
                        .map(|mut f| {
                            let address = f.address.take().map(|a| core::AddressHint {
                                address: a.address,
                                source: a.source,
                            });
                            core::FamilyDecision {
                                address,
                                ..family_decision(f)
                            }
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}
