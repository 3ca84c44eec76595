//! Events the controller records, each one new.
//!
//! kube's `Recorder` folds an Event of the same reason about the same object into the series
//! of the first one it sent, keeping that first note: a second refusal's words, or a second
//! GC summary's counts, would be lost for minutes. The controller decides itself what is worth
//! telling (each refusal once, one GC summary per pool and pass), and publishes each as a new
//! Event.

use allot_k8s::openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder, Reporter};

#[derive(Clone)]
pub struct Events {
    client: kube::Client,
    reporter: Reporter,
}

impl Events {
    pub fn new(client: kube::Client, instance: &str) -> Events {
        Events {
            client,
            reporter: Reporter {
                controller: "allot-controller".into(),
                instance: Some(instance.to_string()),
            },
        }
    }

    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) -> kube::Result<()> {
        Recorder::new(self.client.clone(), self.reporter.clone())
            .publish(event, regarding)
            .await
    }
}
