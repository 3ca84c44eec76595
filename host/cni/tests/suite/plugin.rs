//! The `allot` binary as a runtime meets it: environment + stdin in, stdout + exit status out,
//! against a fake agent ([`crate::harness`]), for each verb and each kind of bad input.

use std::path::Path;
use std::time::{Duration, Instant};

use allot_api::{
    AddRequest, AttachmentId, GcRequest, ParentKind, ParentLink, PodIdentity, Preprobed,
    ProbeSettings,
};
use serde_json::{Value, json};

use crate::harness::*;

// ---------------------------------------------------------------------------------------------
// ADD

#[test]
fn add_prints_the_result_in_each_version() {
    for version in VERSIONS {
        let agent = FakeAgent::ok(serde_json::to_value(dual_stack_result()).unwrap());
        let run = run_env(
            &add_env("/var/run/netns/pod"),
            &conf(version, &agent.socket),
        );
        assert_eq!(run.exit, 0, "{version}: {} {}", run.stdout, run.stderr);
        let old = version < "1.0.0";
        let ip = |family: &str, address: &str, gw: &str| {
            let mut v = json!({"address": address, "gateway": gw});
            if old {
                v["version"] = json!(family);
            }
            v
        };
        assert_eq!(
            run.json(),
            json!({
                "cniVersion": version,
                "ips": [ip("4", "10.6.0.12/24", "10.6.0.1"), ip("6", "fd00:6::12/64", "fd00:6::1")],
                "routes": [{"dst": "10.7.0.0/16", "gw": "10.6.0.254"}],
                "dns": {}
            }),
            "{version}"
        );
        // No `interface` index and no allot-only fields.
        assert!(
            !run.stdout.contains("interface") && !run.stdout.contains("pool"),
            "{}",
            run.stdout
        );

        let seen = agent.seen();
        assert_eq!(
            (seen.method.as_str(), seen.path.as_str()),
            ("POST", "/v1/add")
        );
        let req: AddRequest = serde_json::from_slice(&seen.body).unwrap();
        assert_eq!(
            req,
            AddRequest {
                container_id: CID.into(),
                if_name: "net1".into(),
                netns: "/var/run/netns/pod".into(),
                network: "underlay".into(),
                default_ipv4_pools: vec!["v4-a".into(), "v4-b".into()],
                default_ipv6_pools: vec!["v6-a".into()],
                multus_name: String::new(),
                pod: PodIdentity {
                    namespace: "shop".into(),
                    name: "db-0".into(),
                    uid: "uid-1".into(),
                    owner_kind: Some("StatefulSet".into()),
                    owner_name: Some("db".into()),
                },
                probe: None,
                // A macvlan in bridge mode on a named master: the agent may probe ahead.
                parent: Some(ParentLink {
                    kind: ParentKind::Macvlan,
                    name: "eth1".into(),
                    netns: own_netns(),
                }),
            }
        );
    }
}

/// The parent link is named only where the agent can probe the pod's segment from it.
#[test]
fn add_names_the_parent_link_only_for_a_bridge_or_a_bridge_mode_macvlan() {
    let parent = |main: Value| {
        let agent = FakeAgent::ok(serde_json::to_value(dual_stack_result()).unwrap());
        let mut c: Value = serde_json::from_str(&conf("1.0.0", &agent.socket)).unwrap();
        for k in ["type", "master", "mode"] {
            c.as_object_mut().unwrap().remove(k);
        }
        for (k, v) in main.as_object().unwrap() {
            c[k] = v.clone();
        }
        let run = run_env(&add_env("/var/run/netns/pod"), &c.to_string());
        assert_eq!(run.exit, 0, "{main}: {}", run.stderr);
        let req: AddRequest = serde_json::from_slice(&agent.seen().body).unwrap();
        req.parent.map(|p| (p.kind, p.name))
    };
    let bridge = |name: &str| Some((ParentKind::Bridge, name.to_string()));
    assert_eq!(
        parent(json!({"type": "bridge", "bridge": "br9"})),
        bridge("br9")
    );
    assert_eq!(parent(json!({"type": "bridge"})), bridge("cni0"));
    assert_eq!(
        parent(json!({"type": "bridge", "bridge": "br9", "vlan": 0})),
        bridge("br9")
    );
    assert_eq!(
        parent(json!({"type": "bridge", "bridge": "br9", "vlan": 7})),
        None
    );
    assert_eq!(
        parent(json!({"type": "bridge", "vlanTrunk": [{"id": 5}]})),
        None
    );
    assert_eq!(
        parent(json!({"type": "macvlan", "master": "eth2"})),
        Some((ParentKind::Macvlan, "eth2".into()))
    );
    for other in [
        json!({"type": "macvlan"}),
        json!({"type": "macvlan", "master": "eth2", "mode": "vepa"}),
        json!({"type": "macvlan", "master": "eth2", "linkInContainer": true}),
        json!({"type": "ipvlan", "master": "eth2"}),
        json!({"type": "host-device", "device": "eth2"}),
    ] {
        assert_eq!(parent(other.clone()), None, "{other}");
    }
}

/// Gateways the agent probed ahead are not probed again; with nothing else to probe or
/// announce, the plugin never enters the pod's namespace (here one that does not exist, which
/// would fail the ADD with code 107).
#[test]
fn add_trusts_the_agents_preprobed_gateways() {
    let mut answer = dual_stack_result();
    answer.probe = Some(ProbeSettings {
        gateway: true,
        ..ProbeSettings::default()
    });
    answer.preprobed = Some(Preprobed {
        link: "eth1".into(),
        free: vec![],
        gateways: vec!["10.6.0.1".into(), "fd00:6::1".into()],
        oldest_ms: 1200,
    });
    let agent = FakeAgent::ok(serde_json::to_value(&answer).unwrap());
    let run = run_env(
        &add_env("/nonexistent/netns"),
        &conf("1.0.0", &agent.socket),
    );
    assert_eq!(run.exit, 0, "{} {}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains("gateway 10.6.0.1, gateway fd00:6::1 probed ahead from eth1"),
        "{}",
        run.stderr
    );
    // One gateway left to probe: the namespace is entered, and its absence fails the ADD.
    answer.preprobed.as_mut().unwrap().gateways.pop();
    let agent = FakeAgent::ok(serde_json::to_value(&answer).unwrap());
    let run = run_env(
        &add_env("/nonexistent/netns"),
        &conf("1.0.0", &agent.socket),
    );
    assert_eq!(run.json()["code"], 107, "{}", run.stdout);
}

#[test]
fn add_passes_agent_errors_through() {
    let body = json!({"code": 100, "msg": "no pool can serve shop/db-0 on net1",
                      "details": "v4-a: exhausted; v4-b: node affinity mismatch"});
    let agent = FakeAgent::start(Reply::Http(409, body.to_string()));
    let run = run_env(&add_env("/ns"), &conf("1.0.0", &agent.socket));
    let v = run.error(100);
    assert_eq!(
        v,
        json!({"cniVersion": "1.0.0", "code": 100, "msg": "no pool can serve shop/db-0 on net1",
               "details": "v4-a: exhausted; v4-b: node affinity mismatch"})
    );
    agent.seen();
}

#[test]
fn add_with_the_agent_down_is_try_again_later() {
    for (_dir, socket) in [missing_socket(), dead_socket()] {
        // It waits for an agent to listen until its timeout, then gives up.
        let started = Instant::now();
        let run = run_env(
            &add_env("/ns"),
            &conf_with("1.1.0", &socket, json!({"timeout_ms": 1000})),
        );
        assert!(started.elapsed() >= Duration::from_millis(400));
        let v = run.error(11);
        let msg = v["msg"].as_str().unwrap();
        assert!(
            msg.contains(socket.to_str().unwrap()) && msg.contains("try again later"),
            "{msg}"
        );
    }
}

#[test]
fn add_with_a_silent_agent_times_out() {
    let agent = FakeAgent::start(Reply::Silence(Duration::from_secs(3)));
    let start = Instant::now();
    let run = run_env(
        &add_env("/ns"),
        &conf_with("1.1.0", &agent.socket, json!({"timeout_ms": 300})),
    );
    let v = run.error(11);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(v["msg"].as_str().unwrap().contains("300 ms"), "{v}");
    agent.seen();
}

#[test]
fn add_refuses_a_broken_agent_answer() {
    let agent = FakeAgent::start(Reply::Raw(b"this is not HTTP\r\n\r\n"));
    let run = run_env(&add_env("/ns"), &conf("1.1.0", &agent.socket));
    run.error(5);
    agent.seen();
    let agent = FakeAgent::ok(json!({"ips": [{"address": "10.0.0.1", "pool": "p"}]}));
    let run = run_env(&add_env("/ns"), &conf("1.1.0", &agent.socket));
    let v = run.error(5);
    assert!(v["msg"].as_str().unwrap().contains("CIDR"), "{v}");
    agent.seen();
}

// ---------------------------------------------------------------------------------------------
// DEL

#[test]
fn del_with_the_agent_down_succeeds() {
    for (_dir, socket) in [missing_socket(), dead_socket()] {
        let env = without(&with_command("DEL"), "CNI_NETNS");
        let run = run_env(&env, &conf("1.1.0", &socket));
        run.silent_success();
        assert!(
            run.stderr.contains("for the agent to replay"),
            "{}",
            run.stderr
        );
        assert!(
            run.stderr.contains(socket.to_str().unwrap()),
            "{}",
            run.stderr
        );
        let entries = std::fs::read_dir(journal_of(&socket)).unwrap().count();
        assert_eq!(entries, 1, "the DEL is remembered");
    }
}

#[test]
fn del_with_a_silent_agent_succeeds() {
    let agent = FakeAgent::start(Reply::Silence(Duration::from_secs(3)));
    let run = run_env(
        &with_command("DEL"),
        &conf_with("1.1.0", &agent.socket, json!({"timeout_ms": 300})),
    );
    run.silent_success();
    assert!(
        run.stderr.contains("for the agent to replay"),
        "{}",
        run.stderr
    );
    assert!(journal_of(&agent.socket).is_dir());
    agent.seen();
}

#[test]
fn del_releases_the_attachment_and_is_idempotent() {
    for reply in [
        Reply::Http(200, "{}".into()),
        Reply::Raw(b"HTTP/1.1 204 No Content\r\n\r\n"),
    ] {
        let agent = FakeAgent::start(reply);
        // The namespace may already be gone: no CNI_NETNS, and no CNI_ARGS either.
        let env = without(&without(&with_command("DEL"), "CNI_NETNS"), "CNI_ARGS");
        let run = run_env(&env, &conf("0.3.1", &agent.socket));
        run.silent_success();
        let seen = agent.seen();
        assert_eq!(
            (seen.method.as_str(), seen.path.as_str()),
            ("POST", "/v1/del")
        );
        let id: AttachmentId = serde_json::from_slice(&seen.body).unwrap();
        assert_eq!(
            id,
            AttachmentId {
                container_id: CID.into(),
                if_name: "net1".into()
            }
        );
    }
}

#[test]
fn del_passes_agent_errors_through() {
    let agent = FakeAgent::start(Reply::Http(
        500,
        json!({"code": 103, "msg": "store failed"}).to_string(),
    ));
    let run = run_env(&with_command("DEL"), &conf("1.1.0", &agent.socket));
    assert_eq!(
        run.error(103),
        json!({"cniVersion": "1.1.0", "code": 103, "msg": "store failed"})
    );
    agent.seen();
}

#[test]
fn del_needs_the_attachment() {
    let (_dir, socket) = missing_socket();
    for var in ["CNI_CONTAINERID", "CNI_IFNAME"] {
        let run = run_env(&without(&with_command("DEL"), var), &conf("1.1.0", &socket));
        let v = run.error(4);
        assert!(v["msg"].as_str().unwrap().contains(var), "{v}");
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input

#[test]
fn malformed_config_is_code_6_or_7() {
    let (_dir, socket) = missing_socket();
    let env = add_env("/ns");
    for stdin in ["", "{\"cniVersion\":", "[]", "not json"] {
        run_env(&env, stdin).error(6);
    }
    let cases: Vec<(String, &str)> = vec![
        (
            conf_with("1.1.0", &socket, json!({"default_ipv4_ipool": ["x"]})),
            "default_ipv4_ipool",
        ),
        (
            conf_with("1.1.0", &socket, json!({"socket": 7})),
            "ipam.socket",
        ),
        (
            conf_with("1.1.0", &socket, json!({"default_ipv6_ippool": [1]})),
            "default_ipv6_ippool",
        ),
        (
            json!({"cniVersion": "1.1.0", "ipam": {"type": "allot"}}).to_string(),
            "name",
        ),
        (
            json!({"name": "n", "ipam": {"type": "allot"}}).to_string(),
            "cniVersion",
        ),
        (
            json!({"cniVersion": "1.1.0", "name": "n", "ipam": "allot"}).to_string(),
            "ipam",
        ),
        (
            json!({"cniVersion": "1.1.0", "name": "n", "ipam": null}).to_string(),
            "ipam",
        ),
        (
            json!({"cniVersion": "1.1.0", "name": "n", "type": "bridge"}).to_string(),
            "ipam",
        ),
        (
            conf_with("1.1.0", &socket, json!({"default_ipv4_ippool": "v4-a"})),
            "default_ipv4_ippool",
        ),
    ];
    for (stdin, field) in cases {
        let v = run_env(&env, &stdin).error(7);
        assert!(v["msg"].as_str().unwrap().contains(field), "{field}: {v}");
    }
    // Unknown top-level fields belong to the main plugin and are fine.
    let agent = FakeAgent::ok(serde_json::to_value(dual_stack_result()).unwrap());
    let mut c: Value = serde_json::from_str(&conf("1.1.0", &agent.socket)).unwrap();
    c["somethingElse"] = json!({"a": 1});
    c["runtimeConfig"] = json!({"ips": []});
    assert_eq!(run_env(&env, &c.to_string()).exit, 0);
    agent.seen();
}

#[test]
fn missing_environment_is_code_4() {
    let (_dir, socket) = missing_socket();
    let stdin = conf("1.1.0", &socket);
    let env = add_env("/ns");
    for var in ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS"] {
        let v = run_env(&without(&env, var), &stdin).error(4);
        assert!(v["msg"].as_str().unwrap().contains(var), "{var}: {v}");
    }
    for (args, named) in [
        ("K8S_POD_NAMESPACE=a;K8S_POD_NAME", "K8S_POD_NAME"),
        ("K8S_POD_NAMESPACE=a", "K8S_POD_NAME"),
        ("K8S_POD_NAME=p", "K8S_POD_NAMESPACE"),
        ("K8S_POD_NAMESPACE=a;K8S_POD_NAME=p;FOO=1", "FOO"),
        (
            "K8S_POD_NAMESPACE=a;K8S_POD_NAME=p;ALLOT_OWNER=db",
            "ALLOT_OWNER",
        ),
    ] {
        let v = run_env(&set(&env, "CNI_ARGS", args), &stdin).error(4);
        assert!(v["msg"].as_str().unwrap().contains(named), "{args}: {v}");
    }
    let v = run_env(&without(&env, "CNI_ARGS"), &stdin).error(4);
    assert!(
        v["msg"].as_str().unwrap().contains("K8S_POD_NAMESPACE"),
        "{v}"
    );
    let v = run_env(&set(&env, "CNI_COMMAND", "FROB"), &stdin).error(4);
    assert!(v["msg"].as_str().unwrap().contains("FROB"), "{v}");
    let v = run_env(&set(&env, "CNI_CONTAINERID", "-bad id"), &stdin).error(4);
    assert!(
        v["msg"].as_str().unwrap().contains("CNI_CONTAINERID"),
        "{v}"
    );
}

#[test]
fn unsupported_versions_are_code_1() {
    let (_dir, socket) = missing_socket();
    for version in ["0.1.0", "0.2.0", "1.2.0", "2.0.0"] {
        for cmd in ["ADD", "DEL", "CHECK", "STATUS", "GC"] {
            let v = run_env(&with_command(cmd), &conf(version, &socket)).error(1);
            assert_eq!(v["cniVersion"], version, "{v}");
            assert!(v["msg"].as_str().unwrap().contains("1.1.0"), "{v}");
        }
    }
    // Verbs newer than the config's version.
    for (cmd, version) in [("CHECK", "0.3.1"), ("STATUS", "1.0.0"), ("GC", "0.4.0")] {
        let v = run_env(&with_command(cmd), &conf(version, &socket)).error(1);
        assert!(v["msg"].as_str().unwrap().contains(cmd), "{v}");
    }
}

#[test]
fn version_prints_the_supported_versions() {
    let run = plugin(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"0.4.0"}"#);
    assert_eq!(run.exit, 0);
    assert_eq!(
        run.json(),
        json!({"cniVersion": "1.1.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
    );
    let run = plugin(&[("CNI_COMMAND", "VERSION")], "");
    assert_eq!(run.exit, 0);
}

// ---------------------------------------------------------------------------------------------
// CHECK

fn check_conf(version: &str, socket: &Path, prev_ips: Value) -> String {
    let mut c: Value = serde_json::from_str(&conf(version, socket)).unwrap();
    c["prevResult"] = json!({
        "cniVersion": version,
        "interfaces": [{"name": "net1", "sandbox": "/ns"}],
        "ips": prev_ips,
    });
    c.to_string()
}

#[test]
fn check_compares_with_prev_result() {
    let agent = FakeAgent::ok(serde_json::to_value(dual_stack_result()).unwrap());
    let prev = json!([{"version": "4", "address": "10.6.0.12/24", "interface": 0},
                      {"version": "6", "address": "fd00:6::12/64", "interface": 0}]);
    let run = run_env(
        &with_command("CHECK"),
        &check_conf("0.4.0", &agent.socket, prev),
    );
    run.silent_success();
    let seen = agent.seen();
    assert_eq!(seen.path, "/v1/check");
    assert_eq!(seen.json(), json!({"containerId": CID, "ifName": "net1"}));

    let agent = FakeAgent::ok(serde_json::to_value(dual_stack_result()).unwrap());
    let prev = json!([{"address": "10.6.0.99/24", "interface": 0}]);
    let v = run_env(
        &with_command("CHECK"),
        &check_conf("1.1.0", &agent.socket, prev),
    )
    .error(104);
    let details = v["details"].as_str().unwrap();
    assert!(
        details.contains("10.6.0.99/24") && details.contains("fd00:6::12/64"),
        "{v}"
    );
    agent.seen();

    let agent = FakeAgent::start(Reply::Http(
        404,
        json!({"code": 3, "msg": "no claim"}).to_string(),
    ));
    run_env(
        &with_command("CHECK"),
        &check_conf("1.0.0", &agent.socket, json!([])),
    )
    .error(3);
    agent.seen();

    // Nothing held is a failure even without a prevResult.
    let agent = FakeAgent::ok(json!({"ips": [], "routes": []}));
    let v = run_env(&with_command("CHECK"), &conf("1.1.0", &agent.socket)).error(104);
    assert!(v["msg"].as_str().unwrap().contains("no address"), "{v}");
    agent.seen();

    let (_dir, socket) = missing_socket();
    run_env(
        &with_command("CHECK"),
        &check_conf("1.0.0", &socket, json!([])),
    )
    .error(11);
}

// ---------------------------------------------------------------------------------------------
// GC

#[test]
fn gc_forwards_the_valid_attachments() {
    for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
        let agent = FakeAgent::ok(json!({"released": ["10.6.0.40", "10.6.0.41"]}));
        let mut c: Value = serde_json::from_str(&conf("1.1.0", &agent.socket)).unwrap();
        c[key] = json!([{"containerID": "aaa", "ifname": "eth0"}, {"containerID": "bbb", "ifname": "net1"}]);
        let run = plugin(
            &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")],
            &c.to_string(),
        );
        run.silent_success();
        assert!(run.stderr.contains("10.6.0.41"), "{}", run.stderr);
        let seen = agent.seen();
        assert_eq!(
            (seen.method.as_str(), seen.path.as_str()),
            ("POST", "/v1/gc")
        );
        let req: GcRequest = serde_json::from_slice(&seen.body).unwrap();
        assert_eq!(seen.json()["network"], "underlay", "GC is per network");
        let ids: Vec<(&str, &str)> = req
            .valid_attachments
            .iter()
            .map(|a| (a.container_id.as_str(), a.if_name.as_str()))
            .collect();
        assert_eq!(ids, [("aaa", "eth0"), ("bbb", "net1")]);
    }
}

#[test]
fn gc_without_an_attachment_list_releases_nothing() {
    let (_dir, socket) = missing_socket();
    let v = plugin(&[("CNI_COMMAND", "GC")], &conf("1.1.0", &socket)).error(7);
    assert!(
        v["msg"]
            .as_str()
            .unwrap()
            .contains("cni.dev/valid-attachments"),
        "{v}"
    );
    // An explicit empty list is honoured (everything is released).
    let agent = FakeAgent::ok(json!({"released": []}));
    let mut c: Value = serde_json::from_str(&conf("1.1.0", &agent.socket)).unwrap();
    c["cni.dev/valid-attachments"] = Value::Null;
    plugin(&[("CNI_COMMAND", "GC")], &c.to_string()).silent_success();
    assert_eq!(
        agent.seen().json(),
        json!({"validAttachments": [], "network": "underlay"})
    );
}

// ---------------------------------------------------------------------------------------------
// STATUS

fn status(body: Value) -> Run {
    let agent = FakeAgent::ok(body);
    let run = plugin(&[("CNI_COMMAND", "STATUS")], &conf("1.1.0", &agent.socket));
    let seen = agent.seen();
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("GET", "/v1/status")
    );
    run
}

#[test]
fn status_maps_the_agents_state() {
    let pool =
        |name: &str, free: u64| json!({"name": name, "ipVersion": 4, "total": 254, "free": free});
    status(json!({"ready": true, "message": "", "pools": [pool("a", 0), pool("b", 12)]}))
        .silent_success();

    let v = status(json!({"ready": false, "message": "loading pools", "pools": []})).error(50);
    assert!(v["msg"].as_str().unwrap().contains("loading pools"), "{v}");

    // Exhausted pools fail ADDs (100), not STATUS: a node gating readiness on STATUS stays
    // Ready and keeps its pods.
    status(json!({"ready": true, "message": "", "pools": [pool("a", 0), pool("b", 0)]}))
        .silent_success();
    status(json!({"ready": true, "message": "", "pools": []})).silent_success();

    for (_dir, socket) in [missing_socket(), dead_socket()] {
        let v = plugin(&[("CNI_COMMAND", "STATUS")], &conf("1.1.0", &socket)).error(50);
        assert!(
            v["msg"]
                .as_str()
                .unwrap()
                .contains(socket.to_str().unwrap()),
            "{v}"
        );
    }
}
