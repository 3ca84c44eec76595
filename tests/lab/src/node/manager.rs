//! The node's pods: one watch of the pods bound to the node (`spec.nodeName=<node>`, the
//! field selector the Node authorizer allows a kubelet), one task per pod fed the pod's latest
//! version. After the first complete list, pods the node still has on disk but the API no
//! longer has (deleted while the stand-in was down) are cleaned up: processes, CNI DEL,
//! namespaces.
//!
//! On shutdown, pods stop in two rounds, as a graceful node shutdown orders them: pods with
//! their own network first (their CNI DEL may need a node agent), hostNetwork pods after.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Node;
use super::pod::Worker;

struct Entry {
    pod: watch::Sender<Arc<Pod>>,
    task: JoinHandle<()>,
    host_network: bool,
}

/// How long each shutdown round may take.
const SHUTDOWN_ROUND: Duration = Duration::from_secs(45);

pub async fn run(node: Arc<Node>, mut stop: watch::Receiver<bool>) {
    let api: Api<Pod> = Api::all(node.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", node.id.name));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let (pod_network_stop, pod_network_rx) = watch::channel(false);
    let (host_network_stop, host_network_rx) = watch::channel(false);
    let mut workers: HashMap<String, Entry> = HashMap::new();
    let mut listing: Option<HashSet<String>> = None;
    let mut listed_once = false;
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(Event::Init)) => listing = Some(HashSet::new()),
                Some(Ok(Event::InitApply(pod))) => {
                    if let (Some(seen), Some(uid)) = (&mut listing, &pod.metadata.uid) {
                        seen.insert(uid.clone());
                    }
                    dispatch(&node, &mut workers, pod, &pod_network_rx, &host_network_rx);
                }
                Some(Ok(Event::InitDone)) => {
                    let seen = listing.take().unwrap_or_default();
                    // Pods deleted while the watch was down.
                    workers.retain(|uid, _| seen.contains(uid));
                    if !listed_once {
                        listed_once = true;
                        adopt_orphans(&node, &mut workers, &seen, &pod_network_rx, &host_network_rx);
                    }
                }
                Some(Ok(Event::Apply(pod))) => {
                    dispatch(&node, &mut workers, pod, &pod_network_rx, &host_network_rx);
                }
                Some(Ok(Event::Delete(pod))) => {
                    // Dropping the sender tells the pod's task it is gone.
                    if let Some(uid) = &pod.metadata.uid {
                        workers.remove(uid);
                    }
                }
                Some(Err(e)) => tracing::warn!("watching pods: {e}"),
                None => break,
            },
            _ = stop.changed() => break,
        }
        workers.retain(|_, e| !e.task.is_finished());
    }
    tracing::info!("stopping {} pod(s)", workers.len());
    let (host, own): (Vec<Entry>, Vec<Entry>) = workers.into_values().partition(|e| e.host_network);
    for (round, signal) in [(own, pod_network_stop), (host, host_network_stop)] {
        let _ = signal.send(true);
        let waits = round.into_iter().map(|e| {
            let Entry { pod, task, .. } = e;
            async move {
                let _ = tokio::time::timeout(SHUTDOWN_ROUND, task).await;
                drop(pod);
            }
        });
        futures::future::join_all(waits).await;
    }
}

fn dispatch(
    node: &Arc<Node>,
    workers: &mut HashMap<String, Entry>,
    pod: Pod,
    pod_network: &watch::Receiver<bool>,
    host_network: &watch::Receiver<bool>,
) {
    let Some(uid) = pod.metadata.uid.clone() else {
        return;
    };
    if let Some(entry) = workers.get(&uid)
        && !entry.task.is_finished()
    {
        entry.pod.send_replace(Arc::new(pod));
        return;
    }
    spawn(node, workers, uid, pod, false, pod_network, host_network);
}

fn spawn(
    node: &Arc<Node>,
    workers: &mut HashMap<String, Entry>,
    uid: String,
    pod: Pod,
    gone: bool,
    pod_network: &watch::Receiver<bool>,
    host_network: &watch::Receiver<bool>,
) {
    let is_host = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let (tx, rx) = watch::channel(Arc::new(pod));
    let shutdown = if is_host { host_network } else { pod_network }.clone();
    let worker = Worker::new(node.clone(), rx, shutdown, gone);
    let task = tokio::spawn(worker.run());
    workers.insert(
        uid,
        Entry {
            pod: tx,
            task,
            host_network: is_host,
        },
    );
}

/// Pods on disk that the API does not have: their tasks start "gone" and clean up.
fn adopt_orphans(
    node: &Arc<Node>,
    workers: &mut HashMap<String, Entry>,
    seen: &HashSet<String>,
    pod_network: &watch::Receiver<bool>,
    host_network: &watch::Receiver<bool>,
) {
    for (_, record) in super::state::all(&node.fs.root) {
        if seen.contains(&record.uid) || workers.contains_key(&record.uid) {
            continue;
        }
        tracing::info!(
            "{}/{} is gone from the API: cleaning up what is left of it",
            record.namespace,
            record.name
        );
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(record.name.clone()),
                namespace: Some(record.namespace.clone()),
                uid: Some(record.uid.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        spawn(
            node,
            workers,
            record.uid.clone(),
            pod,
            true,
            pod_network,
            host_network,
        );
    }
}
