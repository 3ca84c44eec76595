//! Responses: JSON objects, `Status` errors worded as the API server words them, watch streams.

use std::convert::Infallible;

use bytes::Bytes;
use futures::StreamExt;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};

use super::{Body, Target};

pub(crate) fn json_response(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed_unsync())
        .expect("a valid response")
}

pub(crate) fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

pub(crate) fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    json_response(code, &status_body(code, reason, message))
}

pub(crate) fn forbidden(verb: &str, target: &Target) -> Response<Body> {
    let group = if target.group.is_empty() {
        "\"\"".to_string()
    } else {
        format!("\"{}\"", target.group)
    };
    let scope = match &target.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    let resource = match &target.name {
        Some(n) => format!("{}.{} \"{n}\"", target.plural, target.group),
        None => format!("{}.{}", target.plural, target.group),
    };
    status(
        403,
        "Forbidden",
        &format!(
            "{resource} is forbidden: User \"system:serviceaccount:allot:allot-agent\" cannot \
             {verb} resource \"{}\" in API group {group} {scope}",
            target.plural
        ),
    )
}

pub(crate) fn line(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

pub(crate) fn stream_response(lines: futures::stream::BoxStream<'static, Bytes>) -> Response<Body> {
    let frames = lines.map(|b| Ok::<_, Infallible>(Frame::data(b)));
    Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(BodyExt::boxed_unsync(StreamBody::new(frames)))
        .expect("a valid response")
}

pub(crate) fn split_api_version(api_version: &str) -> (String, String) {
    match api_version.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), api_version.to_string()),
    }
}

/// Decodes `application/x-www-form-urlencoded` pairs.
pub(crate) fn url_pairs(query: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Now, as object timestamps are written.
pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
