//! Events about pods, as a kubelet records them: core/v1 Events with source `kubelet` and the
//! node as host; a repeated event (same pod, reason and message) increments the first one's
//! count instead of creating another, as client-go's event correlator does.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Warning,
}

/// (pod uid, reason, message) → (event name, count).
type Seen = HashMap<(String, String, String), (String, i32)>;

pub struct Recorder {
    client: kube::Client,
    node: String,
    seen: Mutex<Seen>,
}

pub fn now() -> jiff::Timestamp {
    // Kubernetes serializes times in whole seconds (metav1.Time); MicroTime keeps micros.
    jiff::Timestamp::now()
}

pub fn time_now() -> Time {
    Time(jiff::Timestamp::from_second(now().as_second()).expect("now is in range"))
}

impl Recorder {
    pub fn new(client: kube::Client, node: &str) -> Recorder {
        Recorder {
            client,
            node: node.to_string(),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Records an event about `pod` (and its container `container`, when given). Failures are
    /// logged: an event is never worth failing a pod over.
    pub async fn record(
        &self,
        pod: &Pod,
        container: Option<&str>,
        kind: Kind,
        reason: &str,
        message: &str,
    ) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        // Events hold at most 1 kB of message in practice (kubelet truncates long ones).
        let message: String = message.chars().take(1024).collect();
        let key = (uid.clone(), reason.to_string(), message.clone());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        let existing = self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some((name, count)) = existing {
            let patch = json!({"count": count + 1, "lastTimestamp": time_now()});
            if api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok()
            {
                self.seen
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, (name, count + 1));
                return;
            }
        }
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let stamp = now();
        let name = format!("{pod_name}.{:x}", stamp.as_nanosecond());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod_name.clone()),
                namespace: Some(ns),
                uid: Some(uid),
                field_path: container.map(|c| format!("spec.containers{{{c}}}")),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message),
            type_: Some(
                match kind {
                    Kind::Normal => "Normal",
                    Kind::Warning => "Warning",
                }
                .into(),
            ),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: Some(self.node.clone()),
            }),
            first_timestamp: Some(time_now()),
            last_timestamp: Some(time_now()),
            event_time: None::<MicroTime>,
            count: Some(1),
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some(self.node.clone()),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                self.seen
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, (name, 1));
            }
            Err(e) => tracing::debug!("{pod_name}: event {reason}: {e}"),
        }
    }

    /// Forgets a pod's events (its worker ended).
    pub fn forget(&self, uid: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(u, _, _), _| u != uid);
    }
}
