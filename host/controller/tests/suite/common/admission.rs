//! The admission webhook's handlers as the HTTPS server calls them: requests built as the API
//! server sends them, the objects read from the in-memory API server, the claims from a store.

use std::sync::Arc;

use allot_controller::webhook::admit::{self, Lookup};
use allot_core::store::{Claim, MemoryStore, Store};
use allot_test_apiserver::ApiServer;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde_json::{Value, json};

/// An AdmissionReview's request as the API server sends it, for the object's `apiVersion`
/// and `kind`.
pub fn request(
    operation: &str,
    object: Option<&Value>,
    old: Option<&Value>,
) -> AdmissionRequest<DynamicObject> {
    let some = object.or(old).expect("an object or an old object");
    let kind = some["kind"].as_str().unwrap();
    let name = some["metadata"]["name"].as_str().unwrap();
    let (group, version) = match some["apiVersion"].as_str().unwrap().split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", some["apiVersion"].as_str().unwrap()),
    };
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "6f1e-uid", "operation": operation, "name": name,
            "namespace": some["metadata"]["namespace"],
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version,
                         "resource": format!("{}s", kind.to_lowercase())},
            "userInfo": {"username": "admin"},
            "object": object, "oldObject": old, "dryRun": false,
        }
    });
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(review).unwrap();
    review.try_into().unwrap()
}

/// An in-memory API server holding some objects, and a store holding some claims.
pub struct Cluster {
    pub server: ApiServer,
    pub lookup: Lookup,
}

impl Cluster {
    pub fn new(objects: &[(&str, Value)], claims: &[Claim]) -> Cluster {
        let server = ApiServer::new();
        for (plural, object) in objects {
            server.insert(plural, object.clone());
        }
        let store = MemoryStore::new();
        store.claim(claims).unwrap();
        let lookup = Lookup::new(server.client(), Arc::new(store));
        Cluster { server, lookup }
    }

    pub async fn validate(
        &self,
        op: &str,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> AdmissionResponse {
        let request = request(op, object, old);
        let response = admit::validate(&request, &self.lookup).await;
        assert_eq!(response.uid, "6f1e-uid", "the response answers the request");
        response
    }

    pub async fn allowed(&self, op: &str, object: Option<&Value>, old: Option<&Value>) {
        let r = self.validate(op, object, old).await;
        assert!(r.allowed, "refused: {}", r.result.message);
    }

    /// The refusal's message, which must contain each of `expected`.
    pub async fn denied(
        &self,
        op: &str,
        object: Option<&Value>,
        old: Option<&Value>,
        expected: &[&str],
    ) -> String {
        let r = self.validate(op, object, old).await;
        assert!(!r.allowed, "allowed, expected a refusal with {expected:?}");
        for e in expected {
            assert!(
                r.result.message.contains(e),
                "{:?} lacks {e:?}",
                r.result.message
            );
        }
        r.result.message
    }
}
