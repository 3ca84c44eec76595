//! Target `wire`: the plugin-agent wire format. The bytes are an HTTP/1.1 response as the
//! plugin reads it from the agent's socket (`allot_cni::client::parse_response`); its body (or,
//! when the bytes are no complete response, the bytes themselves) is then decoded as every body
//! of the API (`allot_api`), and the answers the plugin acts on go through what it does with
//! them: rendering an IPAM result for each CNI version, CHECK's comparison, STATUS's verdict,
//! and an `ErrorBody` turned into the printed CNI error object.
//!
//! Invariants beyond "no panic":
//! - a response complete before the end of the stream is complete with the same status and
//!   body at the end of the stream and with bytes appended (the plugin reads until complete);
//! - every API body that decodes encodes and decodes back to itself;
//! - a rendered result is JSON with the version asked for and the agent's addresses; a result
//!   that validates matches its own addresses in CHECK; STATUS is fine exactly when the agent is
//!   ready (full pools are not unavailability); an error object never carries code 0 (success to
//!   some callers).

use allot_api::{
    AddRequest, AttachmentId, ErrorBody, GcRequest, GcResponse, IpamResult, StatusResponse,
};
use allot_cni::client::parse_response;
use allot_cni::cmd;
use allot_cni::config::{CniVersion, SUPPORTED_VERSIONS};
use allot_cni::error::CniError;
use allot_cni::result;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub fn run(data: &[u8]) {
    let at_eof = parse_response(data, true);
    let body = match &at_eof {
        Ok(Some(response)) => response.body.as_slice(),
        _ => data,
    };
    if let Ok(Some(complete)) = parse_response(data, false) {
        assert_eq!(
            at_eof,
            Ok(Some(complete)),
            "complete before the end, not at it"
        );
        let mut longer = data.to_vec();
        longer.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\ntrailing");
        assert_eq!(
            parse_response(&longer, false),
            at_eof,
            "appended bytes changed it"
        );
    }

    if let Some(r) = round_trip::<IpamResult>(body) {
        for v in SUPPORTED_VERSIONS {
            let version = CniVersion::parse(v).expect("a supported version parses");
            if let Ok(out) = result::render(&r, version) {
                let out: Value = serde_json::from_str(&out).expect("a rendered result is JSON");
                assert_eq!(out["cniVersion"], version.as_str());
                let ips = out["ips"].as_array().expect("ips is a list");
                assert_eq!(ips.len(), r.ips.len());
                assert!(!ips.is_empty());
            }
        }
        let prev: Vec<String> = r.ips.iter().map(|ip| ip.address.clone()).collect();
        if result::validate(&r).is_ok() {
            assert!(
                r.ips
                    .iter()
                    .all(|ip| result::parse_cidr(&ip.address).is_some())
            );
            // Its own addresses match, whatever their order.
            let mut reversed = prev.clone();
            reversed.reverse();
            if let Err(e) = result::check_matches(&r, &reversed) {
                panic!("{r:?} does not match its own addresses: {e}");
            }
        }
    }
    if let Some(status) = round_trip::<StatusResponse>(body) {
        // STATUS fails only when the agent cannot serve, never because pools are full (the
        // runtime would stop scheduling pods that need no new address).
        let verdict = cmd::status_verdict(&status);
        assert_eq!(verdict.is_ok(), status.ready);
    }
    if let Some(err) = round_trip::<ErrorBody>(body) {
        let cni: CniError = err.into();
        assert_ne!(cni.code, 0);
        let printed: Value = serde_json::from_str(&cni.to_json("1.1.0")).expect("JSON");
        assert_eq!(printed["code"], cni.code);
    }
    round_trip::<GcResponse>(body);
    round_trip::<AddRequest>(body);
    round_trip::<AttachmentId>(body);
    round_trip::<GcRequest>(body);
}

/// Decodes `body` as `T`; when it decodes, its encoding must decode to the same value.
fn round_trip<T>(body: &[u8]) -> Option<T>
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let value: T = serde_json::from_slice(body).ok()?;
    let encoded = serde_json::to_vec(&value).expect("an API value encodes");
    let again: T = serde_json::from_slice(&encoded).unwrap_or_else(|e| {
        panic!(
            "{value:?} encodes to {} which does not decode: {e}",
            String::from_utf8_lossy(&encoded)
        )
    });
    assert_eq!(again, value);
    Some(value)
}
