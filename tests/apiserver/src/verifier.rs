//! controller-rs's `ApiServerVerifier` over kube's own mock service (`tower-test`): a test
//! takes each request the code under test makes, checks its method, path and body, and answers
//! it as the API server would. A request that never comes fails the test after a timeout.

use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle, SendResponse};

/// The mock's handle: the requests a client made, waiting for answers.
pub type Mock = Handle<Request<Body>, Response<Body>>;

/// How long [`ApiServerVerifier::expect`] waits for a request.
pub const WAIT: Duration = Duration::from_secs(10);

/// A kube client over the mock service, and the verifier that answers its requests.
pub fn mock_client(namespace: &str) -> (kube::Client, ApiServerVerifier) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (
        kube::Client::new(service, namespace),
        ApiServerVerifier::new(handle),
    )
}

/// Checks requests in order. Watch requests are put aside (held open, like a quiet watch)
/// unless a test asks for one with [`ApiServerVerifier::watch`].
pub struct ApiServerVerifier {
    pub handle: Mock,
    watches: Vec<SendResponse<Response<Body>>>,
    /// The content type of each PATCH checked so far, in order.
    pub patch_types: Vec<String>,
}

impl ApiServerVerifier {
    pub fn new(handle: Mock) -> ApiServerVerifier {
        ApiServerVerifier {
            handle,
            watches: Vec::new(),
            patch_types: Vec::new(),
        }
    }

    /// [`ApiServerVerifier::expect`] of a PATCH that must be a JSON merge patch.
    pub async fn expect_merge_patch(
        &mut self,
        path: &str,
    ) -> (Value, SendResponse<Response<Body>>) {
        let answer = self.expect("PATCH", path).await;
        assert_eq!(
            self.patch_types.last().map(String::as_str),
            Some("application/merge-patch+json"),
            "PATCH {path}"
        );
        answer
    }

    /// The next request that is not a watch, checked against `method` and `path`; its JSON
    /// body (`Null` when empty) and the means to answer it.
    pub async fn expect(
        &mut self,
        method: &str,
        path: &str,
    ) -> (Value, SendResponse<Response<Body>>) {
        loop {
            let (request, send) = tokio::time::timeout(WAIT, self.handle.next_request())
                .await
                .unwrap_or_else(|_| panic!("no {method} {path} within {WAIT:?}"))
                .expect("the client hung up");
            if is_watch(&request) {
                self.watches.push(send);
                continue;
            }
            assert_eq!(request.method().as_str(), method, "{}", request.uri());
            assert_eq!(request.uri().path(), path, "{method}");
            if method == "PATCH" {
                // kube sends each patch type with its own content type; a merge patch must not
                // go out as a JSON patch or an apply.
                self.patch_types.push(
                    request.headers()["content-type"]
                        .to_str()
                        .unwrap_or_default()
                        .to_string(),
                );
            }
            return (body(request).await, send);
        }
    }

    /// The next request that is not a watch, unchecked (with its method, path and query).
    pub async fn next(&mut self) -> Option<(String, String, Value, SendResponse<Response<Body>>)> {
        loop {
            let (request, send) = tokio::time::timeout(WAIT, self.handle.next_request())
                .await
                .ok()??;
            if is_watch(&request) {
                self.watches.push(send);
                continue;
            }
            let method = request.method().to_string();
            let uri = request.uri().to_string();
            return Some((method, uri, body(request).await, send));
        }
    }

    /// Asserts that no request (other than watches) comes within `wait`.
    pub async fn expect_nothing(&mut self, wait: Duration) {
        loop {
            match tokio::time::timeout(wait, self.handle.next_request()).await {
                Err(_) | Ok(None) => return,
                Ok(Some((request, send))) if is_watch(&request) => self.watches.push(send),
                Ok(Some((request, _))) => {
                    panic!("unexpected {} {}", request.method(), request.uri())
                }
            }
        }
    }

    /// The next watch request (one put aside earlier, or a new one).
    pub async fn watch(&mut self) -> SendResponse<Response<Body>> {
        if let Some(w) = self.watches.pop() {
            return w;
        }
        let (request, send) = tokio::time::timeout(WAIT, self.handle.next_request())
            .await
            .expect("a watch in time")
            .expect("the client hung up");
        assert!(
            is_watch(&request),
            "expected a watch, got {} {}",
            request.method(),
            request.uri()
        );
        send
    }
}

fn is_watch(request: &Request<Body>) -> bool {
    request
        .uri()
        .query()
        .is_some_and(|q| q.contains("watch=true"))
}

async fn body(request: Request<Body>) -> Value {
    let body = http_body_util::BodyExt::collect(request.into_body())
        .await
        .expect("a request body")
        .to_bytes();
    if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).expect("a JSON body")
    }
}

/// Answers a request with `code` and a JSON body.
pub fn answer(send: SendResponse<Response<Body>>, code: u16, body: Value) {
    send.send_response(
        Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string().into_bytes()))
            .unwrap(),
    );
}

/// A `Status` refusal, as the API server words one.
pub fn refusal(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "reason": reason, "message": message, "code": code})
}
