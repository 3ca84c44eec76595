//! The in-memory API server as a process, for checks written in other languages
//! (`scripts/check-chart.py` runs the chart's rendered commands against it). It serves plain HTTP
//! on a loopback port, prints `listening on ADDR`, then one JSON line per request with what an
//! RBAC authorizer decides on: the caller (the request's bearer token, which a kubeconfig's
//! `token` sets), verb, API group, resource, subresource, namespace, name and field selector.
//! CustomResourceDefinitions are marked Established once stored, as a real API server does when
//! it serves their kind.
//!
//! allot-test-apiserver [--port PORT]

use std::convert::Infallible;
use std::io::Write as _;
use std::time::Duration;

use allot_test_apiserver::ApiServer;
use http_body_util::BodyExt;
use hyper::Request;
use hyper::body::Incoming;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut port = 0u16;
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--port", Some(p)) => port = p.parse().expect("--port PORT"),
            _ => {
                eprintln!("usage: allot-test-apiserver [--port PORT]");
                std::process::exit(2);
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(serve(port));
}

async fn serve(port: u16) {
    let server = ApiServer::new();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("binding a loopback port");
    println!("listening on {}", listener.local_addr().expect("bound"));
    let _ = std::io::stdout().flush();
    tokio::spawn(establish(server.clone()));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let server = server.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let server = server.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let body = body
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    log(&parts);
                    Ok::<_, Infallible>(server.handle(parts, body).await)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// One line of RBAC attributes per request.
fn log(parts: &http::request::Parts) {
    let path: Vec<&str> = parts.uri.path().trim_matches('/').split('/').collect();
    let (group, rest) = match path.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => ("", &[][..]),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (*ns, rest),
        rest => ("", rest),
    };
    let (resource, name, subresource) = match rest {
        [r] => (*r, "", ""),
        [r, n] => (*r, *n, ""),
        [r, n, s] => (*r, *n, *s),
        _ => ("", "", ""),
    };
    let query: Vec<(String, String)> = parts
        .uri
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let param = |k: &str| {
        query
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let verb = match (parts.method.as_str(), name.is_empty()) {
        ("GET", false) => "get",
        ("GET", true) if param("watch") == "true" || param("watch") == "1" => "watch",
        ("GET", true) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        (other, _) => other,
    };
    let caller = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let line = json!({
        "user": caller, "verb": verb, "group": group, "resource": resource,
        "subresource": subresource, "namespace": namespace, "name": name,
        "fieldSelector": param("fieldSelector"),
    });
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// Marks every stored CRD Established (its status, through the status subresource).
async fn establish(server: ApiServer) {
    let gvk = GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
    let crds: Api<DynamicObject> = Api::all_with(
        server.client(),
        &ApiResource::from_gvk_with_plural(&gvk, "customresourcedefinitions"),
    );
    let established =
        json!({"status": {"conditions": [{"type": "Established", "status": "True"}]}});
    loop {
        for crd in server.objects("customresourcedefinitions") {
            if crd["status"]["conditions"] == Value::Null {
                let name = crd["metadata"]["name"].as_str().unwrap_or_default();
                let _ = crds
                    .patch_status(name, &PatchParams::default(), &Patch::Merge(&established))
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
