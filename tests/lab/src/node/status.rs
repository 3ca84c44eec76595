//! A pod's status as the kubelet computes it ("Pod Lifecycle"): the phase from the containers'
//! states and the restart policy, the conditions (PodReadyToStartContainers, Initialized,
//! ContainersReady, Ready), container and init container statuses, host and pod IPs. The
//! result is a strategic-merge patch of the status subresource: conditions merge by type,
//! statuses by name, and a state's other variants are nulled so that only one remains.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::containers::{Runtime, State, Terminated};

/// What the status is computed from.
pub struct Snapshot<'a> {
    pub pod: &'a Pod,
    pub host_ips: &'a [IpAddr],
    pub pod_ips: &'a [IpAddr],
    pub sandbox_ready: bool,
    pub start_time: Option<jiff::Timestamp>,
    pub init: &'a [Runtime],
    pub containers: &'a [Runtime],
}

pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

/// The pod's phase (kubelet `getPhase`).
pub fn phase(pod: &Pod, init: &[Runtime], containers: &[Runtime]) -> &'static str {
    let policy = restart_policy(pod);
    for c in init {
        match &c.state {
            State::Terminated(t) if t.exit_code == 0 => continue,
            State::Terminated(_) if policy == "Never" => return "Failed",
            _ => return "Pending",
        }
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in containers {
        match &c.state {
            State::Running { .. } => running += 1,
            State::Terminated(t) => {
                stopped += 1;
                if t.exit_code == 0 {
                    succeeded += 1;
                }
            }
            State::Waiting { .. } if c.last.is_some() => stopped += 1,
            State::Waiting { .. } => waiting += 1,
        }
    }
    if waiting > 0 {
        "Pending"
    } else if running > 0 {
        "Running"
    } else if stopped > 0 {
        if policy == "Always" {
            "Running"
        } else if stopped == succeeded {
            "Succeeded"
        } else if policy == "Never" {
            "Failed"
        } else {
            "Running"
        }
    } else {
        "Pending"
    }
}

/// True when the pod has finished for good (Succeeded or Failed).
pub fn terminal(phase: &str) -> bool {
    phase == "Succeeded" || phase == "Failed"
}

fn ts(t: &jiff::Timestamp) -> String {
    jiff::Timestamp::from_second(t.as_second())
        .expect("in range")
        .to_string()
}

fn terminated_json(t: &Terminated) -> Value {
    json!({
        "exitCode": t.exit_code,
        "signal": t.signal,
        "reason": t.reason,
        "message": t.message,
        "startedAt": t.started_at.as_ref().map(ts),
        "finishedAt": ts(&t.finished_at),
        "containerID": t.container_id,
    })
}

fn state_json(state: &State) -> Value {
    match state {
        State::Waiting { reason, message } => json!({
            "waiting": {"reason": reason, "message": message}, "running": null, "terminated": null,
        }),
        State::Running { started_at, .. } => json!({
            "waiting": null, "running": {"startedAt": ts(started_at)}, "terminated": null,
        }),
        State::Terminated(t) => json!({
            "waiting": null, "running": null, "terminated": terminated_json(t),
        }),
    }
}

fn container_json(c: &Runtime) -> Value {
    let image = c.spec.image.clone().unwrap_or_default();
    json!({
        "name": c.spec.name,
        "image": image,
        "imageID": format!("allot-lab://{}", crate::image::normalize(&image)),
        "containerID": c.container_id.as_ref().map(|id| format!("allot-lab://{id}")),
        "ready": c.ready,
        "started": c.running() && c.started,
        "restartCount": c.restarts,
        "state": state_json(&c.state),
        "lastState": match &c.last {
            Some(t) => json!({"terminated": terminated_json(t)}),
            None => json!({"terminated": null}),
        },
    })
}

/// A condition, keeping the existing transition time when the status did not change.
fn condition(
    pod: &Pod,
    kind: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
) -> Value {
    let status = if ok { "True" } else { "False" };
    let existing = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == kind));
    let transition = match existing {
        Some(c) if c.status == status => c
            .last_transition_time
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_else(|| ts(&jiff::Timestamp::now())),
        _ => ts(&jiff::Timestamp::now()),
    };
    json!({
        "type": kind, "status": status, "reason": reason, "message": message,
        "lastProbeTime": null, "lastTransitionTime": transition,
    })
}

fn names(list: &[&Runtime]) -> String {
    format!(
        "[{}]",
        list.iter()
            .map(|c| c.spec.name.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    )
}

/// The status patch for `s` (`{"status": {...}}`).
pub fn patch(s: &Snapshot<'_>) -> Value {
    let phase = phase(s.pod, s.init, s.containers);
    let done = terminal(phase);
    let uninitialized: Vec<&Runtime> = s.init.iter().filter(|c| !c.succeeded()).collect();
    let unready: Vec<&Runtime> = s.containers.iter().filter(|c| !c.ready).collect();
    let initialized = uninitialized.is_empty();
    let containers_ready = unready.is_empty() && !done;
    let gates: Vec<String> = s
        .pod
        .spec
        .as_ref()
        .and_then(|sp| sp.readiness_gates.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.condition_type)
        .collect();
    let gate_false: Vec<&String> = gates
        .iter()
        .filter(|g| {
            !s.pod
                .status
                .as_ref()
                .and_then(|st| st.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| &c.type_ == *g && c.status == "True"))
        })
        .collect();
    let ready = containers_ready && gate_false.is_empty();
    let (cr_reason, cr_message) = if done {
        (Some("PodCompleted"), None)
    } else if !unready.is_empty() {
        (
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: {}",
                names(&unready)
            )),
        )
    } else {
        (None, None)
    };
    let (ready_reason, ready_message) = if !containers_ready {
        (cr_reason, cr_message.clone())
    } else if !gate_false.is_empty() {
        (
            Some("ReadinessGatesNotReady"),
            Some(format!(
                "corresponding condition of pod readiness gate {:?} does not exist.",
                gate_false[0]
            )),
        )
    } else {
        (None, None)
    };
    let conditions = vec![
        condition(
            s.pod,
            "PodReadyToStartContainers",
            s.sandbox_ready,
            None,
            None,
        ),
        condition(
            s.pod,
            "Initialized",
            initialized,
            (!initialized).then_some("ContainersNotInitialized"),
            (!initialized).then(|| {
                format!(
                    "containers with incomplete status: {}",
                    names(&uninitialized)
                )
            }),
        ),
        condition(
            s.pod,
            "ContainersReady",
            containers_ready,
            cr_reason,
            cr_message,
        ),
        condition(s.pod, "Ready", ready, ready_reason, ready_message),
    ];
    let ips = |list: &[IpAddr]| -> Value {
        list.iter()
            .map(|ip| json!({"ip": ip.to_string()}))
            .collect()
    };
    let mut status = json!({
        "phase": phase,
        "conditions": conditions,
        "hostIP": s.host_ips.first().map(ToString::to_string),
        "hostIPs": ips(s.host_ips),
        "startTime": s.start_time.as_ref().map(ts),
        "containerStatuses": s.containers.iter().map(container_json).collect::<Vec<_>>(),
    });
    if !s.init.is_empty() {
        status["initContainerStatuses"] = s.init.iter().map(container_json).collect();
    }
    if !s.pod_ips.is_empty() {
        status["podIP"] = json!(s.pod_ips[0].to_string());
        status["podIPs"] = ips(s.pod_ips);
    }
    json!({"status": status})
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn pod(policy: &str) -> Pod {
        Pod {
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn rt(state: State) -> Runtime {
        let mut r = Runtime::new(
            Container {
                name: "c".into(),
                ..Default::default()
            },
            false,
        );
        r.state = state;
        r
    }

    fn exited(code: i32) -> State {
        State::Terminated(Terminated {
            exit_code: code,
            signal: None,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: None,
            started_at: None,
            finished_at: jiff::Timestamp::now(),
            container_id: None,
        })
    }

    #[test]
    fn phases_follow_the_restart_policy() {
        let running = State::Running {
            started_at: jiff::Timestamp::now(),
            pid: None,
        };
        assert_eq!(phase(&pod("Always"), &[], &[rt(running)]), "Running");
        assert_eq!(phase(&pod("Never"), &[], &[rt(exited(0))]), "Succeeded");
        assert_eq!(phase(&pod("Never"), &[], &[rt(exited(1))]), "Failed");
        assert_eq!(phase(&pod("OnFailure"), &[], &[rt(exited(1))]), "Running");
        assert_eq!(phase(&pod("Always"), &[], &[rt(exited(0))]), "Running");
        let waiting = State::Waiting {
            reason: "ContainerCreating".into(),
            message: None,
        };
        assert_eq!(phase(&pod("Always"), &[], &[rt(waiting)]), "Pending");
        assert_eq!(phase(&pod("Never"), &[rt(exited(2))], &[]), "Failed");
    }

    #[test]
    fn a_state_patch_nulls_the_other_variants() {
        let v = state_json(&exited(3));
        assert_eq!(v["terminated"]["exitCode"], 3);
        assert!(v["running"].is_null() && v["waiting"].is_null());
        assert!(v.as_object().unwrap().contains_key("running"));
    }
}
