//! When the webhook's certificates are made, renewed and rotated (`certs::renew`, pure but for
//! key generation): each decision at a chosen time, no waiting.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_controller::webhook::certs::{
    CA_CERT, CA_KEY, CertPolicy, Material, MaterialError, NEXT_CA_CERT, Renewal, next_renewal,
    renew, service_names,
};

const T0: i64 = 1_800_000_000;
const DAY: i64 = 86_400;

fn names() -> Vec<String> {
    service_names("allot-webhook", "allot")
}

fn policy() -> CertPolicy {
    CertPolicy {
        ca_validity: Duration::from_secs(300 * DAY as u64),
        serving_validity: Duration::from_secs(30 * DAY as u64),
        ca_overlap: Duration::from_secs(600),
    }
}

fn fresh(at: i64) -> Material {
    made(&policy(), at)
}

/// Made with a serving certificate as long as its CA: still valid when the CA's rotation begins.
fn fresh_long(at: i64) -> Material {
    let long = CertPolicy {
        serving_validity: policy().ca_validity,
        ..policy()
    };
    made(&long, at)
}

fn made(policy: &CertPolicy, at: i64) -> Material {
    renew(
        Err(&MaterialError::NoSecret),
        &names(),
        policy,
        at,
        true,
        false,
    )
    .unwrap()
    .expect("nothing stored: made")
    .material
}

/// What the leader (`rotate`) or a follower decides at `now`.
fn decide(m: &Material, now: i64, rotate: bool, promote: bool) -> Option<Renewal> {
    renew(Ok(m), &names(), &policy(), now, rotate, promote).unwrap()
}

fn count_certs(bundle: &str) -> usize {
    bundle.matches("BEGIN CERTIFICATE").count()
}

#[test]
fn a_fresh_certificate_needs_nothing_until_two_thirds_of_its_life() {
    let m = fresh(T0);
    assert_eq!(count_certs(&m.bundle), 1);
    assert!(m.bundle.contains(&m.ca_cert));
    assert!(decide(&m, T0, true, true).is_none());
    assert!(decide(&m, T0 + 19 * DAY, true, true).is_none());
    let due = decide(&m, T0 + 21 * DAY, true, false).expect("due");
    assert!(
        due.reason.contains("a third of its validity left"),
        "{}",
        due.reason
    );
    assert_eq!(due.material.ca_cert, m.ca_cert, "the same CA signs");
    assert_ne!(due.material.tls_cert, m.tls_cert);
    assert!(
        decide(&due.material, T0 + 21 * DAY, true, false).is_none(),
        "one renewal"
    );
    assert_eq!(
        next_renewal(&m, &policy(), true),
        Some(T0 + 20 * DAY),
        "the leader looks again at two thirds"
    );
    assert_eq!(next_renewal(&m, &policy(), false), Some(T0 + 30 * DAY));
}

#[test]
fn a_follower_renews_only_what_expired() {
    let m = fresh(T0);
    assert!(decide(&m, T0 + 29 * DAY, false, false).is_none());
    let expired = decide(&m, T0 + 30 * DAY, false, false).expect("expired");
    assert!(expired.reason.contains("expired"), "{}", expired.reason);
}

#[test]
fn a_certificate_for_another_service_or_from_another_ca_is_reissued_at_once() {
    let m = fresh(T0);
    let renamed = service_names("allot-admission", "allot");
    let r = renew(Ok(&m), &renamed, &policy(), T0, false, false)
        .unwrap()
        .expect("reissued");
    assert!(
        r.reason.contains("not valid for allot-admission.allot.svc"),
        "{}",
        r.reason
    );
    assert_eq!(r.material.ca_cert, m.ca_cert);
    // Replicas of the old name (mid-rollout) accept it: it keeps the names it had.
    assert!(decide(&r.material, T0, false, false).is_none());
    let again = renew(Ok(&r.material), &renamed, &policy(), T0, false, false).unwrap();
    assert!(again.is_none(), "no reissuing back and forth");

    let other = fresh(T0);
    let mut mixed = m.clone();
    mixed.tls_cert = other.tls_cert.clone();
    mixed.tls_key = other.tls_key.clone();
    let r = decide(&mixed, T0, false, false).expect("reissued");
    assert!(
        r.reason.contains("tls.crt is not signed by ca.crt"),
        "{}",
        r.reason
    );

    let mut wrong_key = m.clone();
    wrong_key.tls_key = other.tls_key;
    let r = decide(&wrong_key, T0, false, false).expect("reissued");
    assert!(
        r.reason
            .contains("tls.key is not the key of its certificate"),
        "{}",
        r.reason
    );
}

#[test]
fn a_broken_ca_starts_over() {
    let m = fresh(T0);
    let mut broken = m.clone();
    broken.ca_key = fresh(T0).ca_key;
    let r = decide(&broken, T0, false, false).expect("replaced");
    assert!(
        r.reason
            .contains("ca.key is not the key of its certificate"),
        "{}",
        r.reason
    );
    assert_ne!(r.material.ca_cert, m.ca_cert);
    let mut data = m.to_data();
    data.remove(CA_KEY);
    assert_eq!(
        Material::from_data(&data),
        Err(MaterialError::Missing(CA_KEY))
    );
    assert_eq!(
        MaterialError::Missing(CA_KEY).to_string(),
        "ca.key is missing"
    );
    let mut data: BTreeMap<_, _> = m.to_data();
    data.insert(
        NEXT_CA_CERT.into(),
        allot_k8s::openapi::ByteString(m.ca_cert.clone().into_bytes()),
    );
    assert_eq!(Material::from_data(&data), Err(MaterialError::HalfANextCa));
    data.insert(
        CA_CERT.into(),
        allot_k8s::openapi::ByteString(vec![0xff, 0xfe]),
    );
    data.remove(NEXT_CA_CERT);
    assert_eq!(
        Material::from_data(&data),
        Err(MaterialError::NotText(CA_CERT))
    );
}

#[test]
fn the_ca_is_rotated_through_the_bundle_only_once_the_configurations_trust_its_successor() {
    let m = fresh_long(T0);
    // Two thirds of 300 days: the successor joins the bundle, signing nothing yet.
    let at = T0 + 201 * DAY;
    let prepared = decide(&m, at, true, false).expect("a next CA");
    assert!(
        prepared
            .reason
            .contains("its successor joins the CA bundle"),
        "{}",
        prepared.reason
    );
    let (next, _) = prepared.material.next_ca.clone().unwrap();
    assert_eq!(prepared.material.ca_cert, m.ca_cert);
    assert_eq!(prepared.material.tls_cert, m.tls_cert);
    assert_eq!(count_certs(&prepared.material.bundle), 2);
    assert!(prepared.material.bundle.contains(&next));
    // Followers never prepare or promote.
    assert!(decide(&m, at, false, false).is_none());
    // Not before the overlap, and not before the configurations are known to trust it.
    let p = &prepared.material;
    // (The serving certificate is due too: reissued, by the old CA.)
    let early = decide(p, at + 60, true, true);
    assert!(
        early.is_none_or(|r| r.material.ca_cert == m.ca_cert),
        "overlap not over"
    );
    let after = at + 601;
    let kept = decide(p, after, true, false);
    assert!(
        kept.is_none_or(|r| r.material.next_ca.is_some()),
        "no promotion unconfirmed"
    );
    let promoted = decide(p, after, true, true).expect("promoted");
    assert_eq!(promoted.material.ca_cert, next);
    assert!(promoted.material.next_ca.is_none());
    assert!(
        promoted.material.bundle.contains(&m.ca_cert),
        "the old CA stays trusted"
    );
    // Once the old CA expires, it leaves the bundle.
    let tidy = decide(&promoted.material, T0 + 300 * DAY + 1, true, false).expect("tidied");
    assert_eq!(count_certs(&tidy.material.bundle), 1);
    assert!(tidy.material.bundle.contains(&next));
}

#[test]
fn an_expired_ca_is_replaced_by_its_successor_or_started_over_by_anyone() {
    let m = fresh_long(T0);
    let prepared = decide(&m, T0 + 201 * DAY, true, false).unwrap().material;
    let (next, _) = prepared.next_ca.clone().unwrap();
    let r = decide(&prepared, T0 + 300 * DAY, false, false).expect("taken over");
    assert_eq!(r.material.ca_cert, next);
    let r = decide(&m, T0 + 300 * DAY, false, false).expect("started over");
    assert!(r.reason.contains("the CA expired"), "{}", r.reason);
    assert_ne!(r.material.ca_cert, m.ca_cert);
}

#[test]
fn a_serving_certificate_never_outlives_its_ca() {
    let short_ca = CertPolicy {
        ca_validity: Duration::from_secs(10 * DAY as u64),
        ..policy()
    };
    let m = renew(
        Err(&MaterialError::NoSecret),
        &names(),
        &short_ca,
        T0,
        true,
        false,
    )
    .unwrap()
    .unwrap()
    .material;
    assert_eq!(m.serving_not_after(), Some(T0 + 10 * DAY));
}
