//! Events the controller records, each one new.
//!
//! kube's `Recorder` folds an Event of the same reason about the same object into the series
//! of the first one it sent, keeping that first note: a second refusal's words, or a second
//! GC summary's counts, would be lost for minutes. The controller decides itself what is worth
//! telling (each refusal once, one GC summary per pool and pass), and publishes each as a new
//! Event.

use allot_k8s::openapi::api::core::v1::ObjectReference;
use kube::core::Status;
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

    /// Publishes `event`. One about an object whose namespace is being deleted is dropped:
    /// the API server refuses new objects there (403, cause NamespaceTerminating) and nobody
    /// could read it, so it is no failure worth a warning (a pod's addresses are released as
    /// its namespace goes, one refusal per pod).
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) -> kube::Result<()> {
        match Recorder::new(self.client.clone(), self.reporter.clone())
            .publish(event, regarding)
            .await
        {
            Err(kube::Error::Api(status)) if namespace_terminating(&status) => {
                tracing::debug!(reason = %event.reason, "Event dropped: {}", status.message);
                Ok(())
            }
            other => other,
        }
    }
}

/// Whether the API server refused a write because its namespace is being deleted
/// (`StatusCause` reason `NamespaceTerminating`, from the NamespaceLifecycle admission plugin).
fn namespace_terminating(status: &Status) -> bool {
    status.code == 403
        && status
            .details
            .as_ref()
            .is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::response::{StatusCause, StatusDetails};

    fn forbidden(cause: &str) -> Status {
        Status::failure("forbidden", "Forbidden")
            .with_code(403)
            .with_details(StatusDetails {
                causes: vec![StatusCause {
                    reason: cause.into(),
                    message: "namespace is being terminated".into(),
                    field: "metadata.namespace".into(),
                }],
                name: String::new(),
                group: String::new(),
                kind: "events".into(),
                uid: String::new(),
                retry_after_seconds: 0,
            })
    }

    #[test]
    fn only_a_refusal_for_a_terminating_namespace_is_dropped() {
        assert!(namespace_terminating(&forbidden("NamespaceTerminating")));
        // RBAC's refusal must still be reported: the chart's ClusterRole would be wrong.
        assert!(!namespace_terminating(&forbidden("")));
        assert!(!namespace_terminating(
            &Status::failure("forbidden", "Forbidden").with_code(403)
        ));
        assert!(!namespace_terminating(
            &forbidden("NamespaceTerminating").with_code(409)
        ));
    }
}
