//! Every API path of the webhook's certificate and configuration keeping against kube's own mock
//! service (tower-test), in controller-rs's style: an `ApiServerVerifier` checks each request
//! (method, path, body) and answers it as the API server would, refusals included; a request
//! that never comes fails on a timeout, and one that should not come fails the check that
//! nothing more was asked.

use std::time::Duration;

use allot_controller::webhook::certs::{CertPolicy, Material, fresh, service_names};
use allot_controller::webhook::configs::{self, Outcome, Target};
use allot_controller::webhook::secret::{self, unix_now};
use allot_k8s::openapi::api::core::v1::Secret;
use allot_test_apiserver::verifier::{self, ApiServerVerifier, answer};
use http::{Request, Response};
use kube::Api;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock;

const SECRETS: &str = "/api/v1/namespaces/allot/secrets";
const SECRET: &str = "/api/v1/namespaces/allot/secrets/allot-webhook-tls";
const VALIDATING: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
const MUTATING: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";

fn refusal(code: u16, reason: &str) -> Value {
    verifier::refusal(code, reason, &format!("injected {reason}"))
}

fn names() -> Vec<String> {
    service_names("allot-webhook", "allot")
}

fn material(policy: &CertPolicy) -> Material {
    made_at(policy, unix_now())
}

/// Material made at `at` (Unix seconds): in the past, to be due for renewal now.
fn made_at(policy: &CertPolicy, at: i64) -> Material {
    fresh(&names(), policy, at).unwrap()
}

/// `m` as the Secret stored at `rv`.
fn stored(m: &Material, rv: &str) -> Value {
    let secret = Secret {
        data: Some(m.to_data()),
        type_: Some("kubernetes.io/tls".into()),
        ..Secret::default()
    };
    let mut v = serde_json::to_value(secret).unwrap();
    v["apiVersion"] = json!("v1");
    v["kind"] = json!("Secret");
    v["metadata"] =
        json!({"name": "allot-webhook-tls", "namespace": "allot", "resourceVersion": rv});
    v
}

fn of_body(body: &Value) -> Material {
    let secret: Secret = serde_json::from_value(body.clone()).unwrap();
    Material::from_data(&secret.data.unwrap()).unwrap()
}

/// `secret::ensure` on the mock, as the leader (`rotate`) or not, never promoting.
fn ensure(
    rotate: bool,
) -> (
    tokio::task::JoinHandle<anyhow::Result<Material>>,
    ApiServerVerifier,
) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let api: Api<Secret> = Api::namespaced(kube::Client::new(service, "default"), "allot");
    let call = tokio::spawn(async move {
        secret::ensure(
            &api,
            "allot-webhook-tls",
            &names(),
            &CertPolicy::default(),
            rotate,
            &|_| false,
        )
        .await
    });
    (call, ApiServerVerifier::new(handle))
}

#[tokio::test]
async fn an_absent_secret_is_created_with_a_ca_and_a_serving_certificate() {
    let (call, mut api) = ensure(false);
    let (_, send) = api.expect("GET", SECRET).await;
    answer(send, 404, refusal(404, "NotFound"));
    let (body, send) = api.expect("POST", SECRETS).await;
    assert_eq!(body["type"], "kubernetes.io/tls");
    assert_eq!(body["metadata"]["name"], "allot-webhook-tls");
    assert_eq!(
        body["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "allot-controller"
    );
    assert_eq!(
        body["metadata"]["annotations"]["allot.dev/webhook-certificate-reason"],
        "no certificate yet"
    );
    assert!(body["metadata"].get("resourceVersion").is_none());
    let written = of_body(&body);
    answer(send, 201, body);
    assert_eq!(call.await.unwrap().unwrap(), written);
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn a_replica_that_loses_the_create_serves_the_winners_certificate() {
    let winner = material(&CertPolicy::default());
    let (call, mut api) = ensure(false);
    let (_, send) = api.expect("GET", SECRET).await;
    answer(send, 404, refusal(404, "NotFound"));
    let (_, send) = api.expect("POST", SECRETS).await;
    answer(send, 409, refusal(409, "AlreadyExists"));
    let (_, send) = api.expect("GET", SECRET).await;
    answer(send, 200, stored(&winner, "7"));
    assert_eq!(call.await.unwrap().unwrap(), winner);
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn a_usable_secret_is_read_and_nothing_is_written() {
    let current = material(&CertPolicy::default());
    let (call, mut api) = ensure(true);
    let (_, send) = api.expect("GET", SECRET).await;
    answer(send, 200, stored(&current, "7"));
    assert_eq!(call.await.unwrap().unwrap(), current);
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn an_unusable_secret_is_replaced_on_its_resource_version() {
    let (call, mut api) = ensure(false);
    let (_, send) = api.expect("GET", SECRET).await;
    let mut broken = stored(&material(&CertPolicy::default()), "7");
    broken["data"]["ca.key"] = json!("Z2FyYmFnZQ==");
    answer(send, 200, broken);
    let (body, send) = api.expect("PUT", SECRET).await;
    assert_eq!(
        body["metadata"]["resourceVersion"], "7",
        "a compare-and-swap"
    );
    let reason = body["metadata"]["annotations"]["allot.dev/webhook-certificate-reason"]
        .as_str()
        .unwrap();
    assert!(reason.contains("ca.key is not a private key"), "{reason}");
    let written = of_body(&body);
    answer(send, 200, body);
    assert_eq!(call.await.unwrap().unwrap(), written);
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn the_leader_renews_a_certificate_due_and_a_lost_swap_reads_the_winner() {
    // Six seconds of validity, made five seconds ago: past two thirds of its life.
    let short = CertPolicy {
        serving_validity: Duration::from_secs(6),
        ..CertPolicy::default()
    };
    let due = made_at(&short, unix_now() - 5);
    let (call, mut api) = ensure(true);
    let (_, send) = api.expect("GET", SECRET).await;
    answer(send, 200, stored(&due, "7"));
    let (body, send) = api.expect("PUT", SECRET).await;
    assert_eq!(body["metadata"]["resourceVersion"], "7");
    let renewed = of_body(&body);
    assert_eq!(renewed.ca_cert, due.ca_cert, "the same CA signs");
    assert_ne!(renewed.tls_cert, due.tls_cert);
    // Another replica renewed first: read again, serve its version, write nothing more.
    answer(send, 409, refusal(409, "Conflict"));
    let theirs = material(&CertPolicy::default());
    let (_, send) = api.expect("GET", SECRET).await;
    answer(send, 200, stored(&theirs, "8"));
    assert_eq!(call.await.unwrap().unwrap(), theirs);
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn a_follower_leaves_a_certificate_due_alone_until_it_expires() {
    let short = CertPolicy {
        serving_validity: Duration::from_secs(6),
        ..CertPolicy::default()
    };
    let due = made_at(&short, unix_now() - 5);
    let (call, mut api) = ensure(false);
    let (_, send) = api.expect("GET", SECRET).await;
    answer(send, 200, stored(&due, "7"));
    assert_eq!(call.await.unwrap().unwrap(), due);
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn a_forbidden_read_says_which_permission_is_missing() {
    let (call, mut api) = ensure(false);
    let (_, send) = api.expect("GET", SECRET).await;
    answer(send, 403, refusal(403, "Forbidden"));
    let e = call.await.unwrap().unwrap_err().to_string();
    assert!(
        e.contains("Secret allot-webhook-tls: get") && e.contains("needs get"),
        "{e}"
    );
    api.expect_nothing(Duration::from_millis(200)).await;
}

fn target() -> Target {
    Target {
        config_name: "allot".into(),
        namespace: "allot".into(),
        service: "allot-webhook".into(),
        port: 443,
        owner: None,
    }
}

const BUNDLE: &[u8] = b"-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n";

fn ensure_configs() -> (
    tokio::task::JoinHandle<anyhow::Result<[Outcome; 2]>>,
    ApiServerVerifier,
) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let call = tokio::spawn(async move { configs::ensure(&client, &target(), BUNDLE).await });
    (call, ApiServerVerifier::new(handle))
}

/// A configuration as stored at `rv`, with what the API server defaults filled in.
fn stored_config(mut config: Value, kind: &str, rv: &str) -> Value {
    config["apiVersion"] = json!("admissionregistration.k8s.io/v1");
    config["kind"] = json!(kind);
    config["metadata"]["resourceVersion"] = json!(rv);
    config["metadata"]["uid"] = json!("uid-1");
    config
}

fn validating(bundle: &[u8]) -> Value {
    serde_json::to_value(configs::validating(&target(), bundle)).unwrap()
}

fn mutating(bundle: &[u8]) -> Value {
    serde_json::to_value(configs::mutating(&target(), bundle)).unwrap()
}

fn base64(bytes: &[u8]) -> Value {
    serde_json::to_value(allot_k8s::openapi::ByteString(bytes.to_vec())).unwrap()
}

#[tokio::test]
async fn absent_configurations_are_created_trusting_the_bundle() {
    let (call, mut api) = ensure_configs();
    let (_, send) = api.expect("GET", &format!("{VALIDATING}/allot")).await;
    answer(send, 404, refusal(404, "NotFound"));
    let (body, send) = api.expect("POST", VALIDATING).await;
    assert_eq!(
        body["webhooks"][0]["clientConfig"]["caBundle"],
        base64(BUNDLE)
    );
    assert_eq!(body["webhooks"][0]["failurePolicy"], "Fail");
    answer(
        send,
        201,
        stored_config(body, "ValidatingWebhookConfiguration", "3"),
    );
    let (_, send) = api.expect("GET", &format!("{MUTATING}/allot")).await;
    answer(send, 404, refusal(404, "NotFound"));
    let (body, send) = api.expect("POST", MUTATING).await;
    assert_eq!(
        body["webhooks"][0]["clientConfig"]["caBundle"],
        base64(BUNDLE)
    );
    assert_eq!(body["webhooks"][0]["failurePolicy"], "Ignore");
    answer(
        send,
        201,
        stored_config(body, "MutatingWebhookConfiguration", "4"),
    );
    assert_eq!(
        call.await.unwrap().unwrap(),
        [Outcome::Created, Outcome::Created]
    );
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn configurations_that_are_true_are_left_alone() {
    let (call, mut api) = ensure_configs();
    let (_, send) = api.expect("GET", &format!("{VALIDATING}/allot")).await;
    let mut live = stored_config(validating(BUNDLE), "ValidatingWebhookConfiguration", "3");
    // Fields the API server fills in that this controller does not decide are not compared.
    live["metadata"]["managedFields"] = json!([]);
    answer(send, 200, live);
    let (_, send) = api.expect("GET", &format!("{MUTATING}/allot")).await;
    answer(
        send,
        200,
        stored_config(mutating(BUNDLE), "MutatingWebhookConfiguration", "4"),
    );
    assert_eq!(
        call.await.unwrap().unwrap(),
        [Outcome::Unchanged, Outcome::Unchanged]
    );
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn a_ca_bundle_reset_by_an_upgrade_is_repaired_on_its_resource_version() {
    let (call, mut api) = ensure_configs();
    let (_, send) = api.expect("GET", &format!("{VALIDATING}/allot")).await;
    let mut reset = stored_config(validating(b""), "ValidatingWebhookConfiguration", "3");
    reset["webhooks"][0]["clientConfig"]
        .as_object_mut()
        .unwrap()
        .remove("caBundle");
    reset["metadata"]["labels"] = json!({"helm.sh/chart": "allot-0.1.0"});
    answer(send, 200, reset.clone());
    let (body, send) = api.expect("PUT", &format!("{VALIDATING}/allot")).await;
    assert_eq!(
        body["metadata"]["resourceVersion"], "3",
        "a compare-and-swap"
    );
    assert_eq!(body["metadata"]["labels"]["helm.sh/chart"], "allot-0.1.0");
    assert_eq!(
        body["webhooks"][0]["clientConfig"]["caBundle"],
        base64(BUNDLE)
    );
    // Someone else wrote in between: read again; by now it is true.
    answer(send, 409, refusal(409, "Conflict"));
    let (_, send) = api.expect("GET", &format!("{VALIDATING}/allot")).await;
    answer(
        send,
        200,
        stored_config(validating(BUNDLE), "ValidatingWebhookConfiguration", "5"),
    );
    let (_, send) = api.expect("GET", &format!("{MUTATING}/allot")).await;
    let stale = stored_config(mutating(b"old CA"), "MutatingWebhookConfiguration", "4");
    answer(send, 200, stale);
    let (body, send) = api.expect("PUT", &format!("{MUTATING}/allot")).await;
    assert_eq!(
        body["webhooks"][0]["clientConfig"]["caBundle"],
        base64(BUNDLE)
    );
    answer(send, 200, body);
    let outcomes = call.await.unwrap().unwrap();
    assert_eq!(outcomes[0], Outcome::Unchanged);
    assert_eq!(
        outcomes[1],
        Outcome::Repaired(vec!["default.allot.dev caBundle".into()])
    );
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn removing_the_configurations_accepts_one_already_gone() {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let call = tokio::spawn(async move { configs::remove(&client, "allot").await });
    let mut api = ApiServerVerifier::new(handle);
    let (_, send) = api.expect("DELETE", &format!("{VALIDATING}/allot")).await;
    answer(send, 200, refusal(200, "Success"));
    let (_, send) = api.expect("DELETE", &format!("{MUTATING}/allot")).await;
    answer(send, 404, refusal(404, "NotFound"));
    call.await.unwrap().unwrap();
    api.expect_nothing(Duration::from_millis(200)).await;
}
