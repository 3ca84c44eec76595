//! The agent's [`IpamResult`] (CNI 1.1.0 shape) rendered in the caller's `cniVersion`, and the
//! CHECK comparison with `prevResult`.
//!
//! Shapes, for an IPAM plugin (no `interfaces`, so no `interface` index in `ips`):
//! - 1.0.0 and 1.1.0: `{"cniVersion","ips":[{"address","gateway"}],"routes":[{"dst","gw"}],"dns":{}}`
//! - 0.3.0, 0.3.1 and 0.4.0: the same, plus `"version":"4"|"6"` in each `ips` entry.
//!
//! `routes` is left out when empty and `dns` is always `{}`, exactly as the reference Go types
//! print them. The agent's `pool` field is allot's own and is not printed.

use std::net::IpAddr;

use allot_api::IpamResult;
use serde::Serialize;

use crate::config::CniVersion;
use crate::error::CniError;

/// Local code for "CHECK found the agent's addresses differ from `prevResult`". allot-api has no
/// constant for it yet (reported to the lead); 100-103 are taken there.
pub const CHECK_MISMATCH: u32 = 104;

#[derive(Serialize)]
struct Out<'a> {
    #[serde(rename = "cniVersion")]
    cni_version: &'static str,
    ips: Vec<OutIp<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routes: Vec<OutRoute<'a>>,
    dns: Dns,
}

#[derive(Serialize)]
struct OutIp<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'static str>,
    address: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    gateway: Option<&'a str>,
}

#[derive(Serialize)]
struct OutRoute<'a> {
    dst: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    gw: Option<&'a str>,
}

/// allot configures no DNS; an empty object, as Go's `types.DNS{}` prints.
#[derive(Serialize)]
struct Dns {}

/// Renders the result for `version`, after checking that the agent's addresses are what the
/// spec demands (CIDR addresses, plain gateway addresses of the same family), so that a
/// broken agent cannot make the runtime configure garbage.
pub fn render(result: &IpamResult, version: CniVersion) -> Result<String, CniError> {
    validate(result)?;
    if result.ips.is_empty() {
        return Err(CniError::io(
            "allot-agent returned an invalid result: no addresses",
        ));
    }
    let with_family = version < CniVersion::V100;
    let ips = result
        .ips
        .iter()
        .map(|ip| OutIp {
            version: with_family.then(|| match parse_cidr(&ip.address) {
                Some((IpAddr::V6(_), _)) => "6",
                _ => "4",
            }),
            address: &ip.address,
            gateway: ip.gateway.as_deref(),
        })
        .collect();
    let routes = result
        .routes
        .iter()
        .map(|r| OutRoute {
            dst: &r.dst,
            gw: r.gw.as_deref(),
        })
        .collect();
    let out = Out {
        cni_version: version.as_str(),
        ips,
        routes,
        dns: Dns {},
    };
    serde_json::to_string(&out).map_err(|e| CniError::io(format!("cannot encode the result: {e}")))
}

/// The agent's addresses, gateways and routes must be well-formed.
pub fn validate(result: &IpamResult) -> Result<(), CniError> {
    let bad =
        |what: String| CniError::io(format!("allot-agent returned an invalid result: {what}"));
    for ip in &result.ips {
        let Some((addr, _)) = parse_cidr(&ip.address) else {
            return Err(bad(format!(
                "address {:?} is not in CIDR notation",
                ip.address
            )));
        };
        if let Some(gw) = &ip.gateway {
            match gw.parse::<IpAddr>() {
                Ok(g) if g.is_ipv4() == addr.is_ipv4() => {}
                _ => {
                    return Err(bad(format!(
                        "gateway {gw:?} of {} is not an address of the same family",
                        ip.address
                    )));
                }
            }
        }
    }
    for route in &result.routes {
        if parse_cidr(&route.dst).is_none() {
            return Err(bad(format!(
                "route destination {:?} is not a CIDR",
                route.dst
            )));
        }
        if let Some(gw) = &route.gw
            && gw.parse::<IpAddr>().is_err()
        {
            return Err(bad(format!("route gateway {gw:?} is not an address")));
        }
    }
    Ok(())
}

/// `10.0.0.5/24` → (10.0.0.5, 24), with the prefix checked against the family.
pub fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (addr, prefix) = s.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    // Digits only: `u8::from_str` would also take "+24".
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let prefix: u8 = prefix.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some((addr, prefix))
}

/// CHECK: the addresses allot holds for the attachment must be exactly those of `prevResult`
/// (compared as address and prefix, so `fd00::0001/64` equals `fd00::1/64`).
pub fn check_matches(held: &IpamResult, prev: &[String]) -> Result<(), CniError> {
    let norm = |s: &str| parse_cidr(s);
    let held_set: Vec<_> = held.ips.iter().filter_map(|ip| norm(&ip.address)).collect();
    let mut prev_set = Vec::with_capacity(prev.len());
    for p in prev {
        match norm(p) {
            Some(x) => prev_set.push(x),
            None => {
                return Err(CniError::invalid_config(format!(
                    "prevResult address {p:?} is not in CIDR notation"
                )));
            }
        }
    }
    let missing: Vec<&str> = held
        .ips
        .iter()
        .filter(|ip| norm(&ip.address).is_some_and(|x| !prev_set.contains(&x)))
        .map(|ip| ip.address.as_str())
        .collect();
    let extra: Vec<&str> = prev
        .iter()
        .filter(|p| norm(p).is_some_and(|x| !held_set.contains(&x)))
        .map(String::as_str)
        .collect();
    if missing.is_empty() && extra.is_empty() {
        return Ok(());
    }
    let mut details = Vec::new();
    if !missing.is_empty() {
        details.push(format!(
            "held by allot but not in prevResult: {}",
            missing.join(", ")
        ));
    }
    if !extra.is_empty() {
        details.push(format!(
            "in prevResult but not held by allot: {}",
            extra.join(", ")
        ));
    }
    Err(CniError::new(
        CHECK_MISMATCH,
        "the addresses allot holds for this attachment differ from prevResult",
    )
    .with_details(details.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_api::{IpConfig, RouteConfig};
    use serde_json::{Value, json};

    fn dual_stack() -> IpamResult {
        IpamResult {
            ips: vec![
                IpConfig {
                    address: "10.0.0.5/24".into(),
                    gateway: Some("10.0.0.1".into()),
                    pool: "v4".into(),
                },
                IpConfig {
                    address: "fd00::5/64".into(),
                    gateway: None,
                    pool: "v6".into(),
                },
            ],
            routes: vec![RouteConfig {
                dst: "0.0.0.0/0".into(),
                gw: Some("10.0.0.1".into()),
            }],
            probe: None,
            preprobed: None,
            guest_addresses: vec![],
        }
    }

    fn rendered(v: CniVersion) -> Value {
        serde_json::from_str(&render(&dual_stack(), v).unwrap()).unwrap()
    }

    #[test]
    fn v1_shape_has_no_version_field() {
        for v in [CniVersion::V100, CniVersion::V110] {
            assert_eq!(
                rendered(v),
                json!({
                    "cniVersion": v.as_str(),
                    "ips": [
                        {"address":"10.0.0.5/24","gateway":"10.0.0.1"},
                        {"address":"fd00::5/64"}
                    ],
                    "routes": [{"dst":"0.0.0.0/0","gw":"10.0.0.1"}],
                    "dns": {}
                })
            );
        }
    }

    #[test]
    fn old_shapes_carry_the_family() {
        for v in [CniVersion::V030, CniVersion::V031, CniVersion::V040] {
            assert_eq!(
                rendered(v),
                json!({
                    "cniVersion": v.as_str(),
                    "ips": [
                        {"version":"4","address":"10.0.0.5/24","gateway":"10.0.0.1"},
                        {"version":"6","address":"fd00::5/64"}
                    ],
                    "routes": [{"dst":"0.0.0.0/0","gw":"10.0.0.1"}],
                    "dns": {}
                })
            );
        }
    }

    #[test]
    fn field_order_and_empty_routes() {
        let mut r = dual_stack();
        r.routes.clear();
        r.ips.truncate(1);
        assert_eq!(
            render(&r, CniVersion::V040).unwrap(),
            r#"{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.0.0.5/24","gateway":"10.0.0.1"}],"dns":{}}"#
        );
    }

    #[test]
    fn invalid_agent_results_are_refused() {
        let mut r = dual_stack();
        r.ips[0].address = "10.0.0.5".into();
        assert!(
            render(&r, CniVersion::V110)
                .unwrap_err()
                .msg
                .contains("CIDR")
        );
        let mut r = dual_stack();
        r.ips[0].gateway = Some("fd00::1".into());
        assert!(
            render(&r, CniVersion::V110)
                .unwrap_err()
                .msg
                .contains("gateway")
        );
        let mut r = dual_stack();
        r.routes[0].dst = "nowhere".into();
        assert!(render(&r, CniVersion::V110).is_err());
        let e = render(&IpamResult::default(), CniVersion::V110).unwrap_err();
        assert_eq!(e.code, allot_api::codes::IO_FAILURE);
    }

    #[test]
    fn cidr_parsing() {
        assert_eq!(
            parse_cidr("10.0.0.5/24"),
            Some(("10.0.0.5".parse().unwrap(), 24))
        );
        assert_eq!(parse_cidr("fd00::1/128").map(|x| x.1), Some(128));
        for bad in [
            "10.0.0.5",
            "10.0.0.5/33",
            "fd00::1/129",
            "10.0.0.5/+2",
            "10.0.0.5/",
            "x/24",
        ] {
            assert_eq!(parse_cidr(bad), None, "{bad}");
        }
    }

    #[test]
    fn check_compares_address_sets() {
        let held = dual_stack();
        let prev = vec!["fd00::0005/64".to_string(), "10.0.0.5/24".to_string()];
        assert!(check_matches(&held, &prev).is_ok());
        let e = check_matches(&held, &["10.0.0.5/24".into()]).unwrap_err();
        assert_eq!(e.code, CHECK_MISMATCH);
        assert!(
            e.details
                .contains("held by allot but not in prevResult: fd00::5/64"),
            "{e}"
        );
        let e = check_matches(
            &held,
            &[prev[0].clone(), prev[1].clone(), "10.0.0.9/24".into()],
        )
        .unwrap_err();
        assert!(e.details.contains("not held by allot: 10.0.0.9/24"), "{e}");
        let e = check_matches(&held, &["garbage".into()]).unwrap_err();
        assert_eq!(e.code, allot_api::codes::INVALID_NETWORK_CONFIG);
    }
}
