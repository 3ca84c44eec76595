//! Rolling out a policy: record what an agent decided and replay it (`allotctl policy record`,
//! `test`, `diff`); ship a component through an OCI registry (`allotctl policy push|pull`) that
//! the agent pulls by digest, standalone (`--policy oci://…`) and in cluster mode (a Policy
//! whose source is `oci:`, on a real kube-apiserver). The registry is Debian's
//! docker-registry on a loopback port.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use allot_e2e::kube::{ALLOT, KubeApi};
use allot_e2e::registry::Registry;
use allot_e2e::*;
use serde_json::{Value, json};

fn allotctl(args: &[&str]) -> Output {
    Command::new(bin("allotctl"))
        .args(args)
        .env(
            "ALLOT_CACHE_DIR",
            std::env::temp_dir().join("allot-e2e-policy-cache"),
        )
        .output()
        .expect("running allotctl")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn wasm(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/wasm-policies/wasm32-wasip2/release")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: build the test policies with `make policies`",
        path.display()
    );
    path
}

/// The default policy as a file, as the agent embeds it (built by host/policy's build script).
fn default_wasm() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/wasm-default-policy/wasm32-wasip2/release/allot_policy_default.wasm");
    assert!(
        path.exists(),
        "{} is missing: build the workspace first",
        path.display()
    );
    path
}

/// An ADD as the plugin sends it, with the network config's default pools.
fn add(agent: &Agent, pod: &str, v4: &[&str], v6: &[&str]) -> (u16, String) {
    let body = json!({
        "containerId": format!("rec-{pod}-{}", std::process::id()),
        "ifName": "eth0",
        "network": "rollout",
        "defaultIpv4Pools": v4,
        "defaultIpv6Pools": v6,
        "pod": {"namespace": "team-a", "name": pod, "uid": format!("uid-{pod}"),
                "ownerKind": "StatefulSet", "ownerName": "db"},
    });
    http_post(&agent.socket(), "/v1/add", &body.to_string()).expect("the agent answers")
}

fn decisions(agent: &Agent) -> Value {
    let (code, body) = agent.get("/v1/decisions").expect("the agent answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Pools with every fact a policy sees: free counts, an exhausted pool, a disabled one, one
/// whose every address is reserved, and IPv6.
fn rollout_pools() -> String {
    [
        ippool(
            "small",
            "10.61.0.0/24",
            Some("10.61.0.1"),
            &["10.61.0.10-10.61.0.13"],
        ),
        ippool(
            "large",
            "10.61.1.0/24",
            Some("10.61.1.1"),
            &["10.61.1.10-10.61.1.99"],
        ),
        ippool("single", "10.61.2.0/24", None, &["10.61.2.10"]),
        ippool("held", "10.61.3.0/24", None, &["10.61.3.10-10.61.3.11"]),
        document(
            "IPPool",
            "off",
            json!({"subnet": "10.61.4.0/24", "ips": ["10.61.4.10"], "disable": true}),
        ),
        ippool("six", "fd00:61::/64", None, &["fd00:61::10-fd00:61::20"]),
        document(
            "ReservedIP",
            "hold-all",
            json!({"ips": ["10.61.3.10-10.61.3.11"]}),
        ),
    ]
    .concat()
}

/// The decisions a real agent made, written as scenarios, pass `allotctl policy test` against
/// the policy that made them; `diff` against another policy names what it would change; the
/// ring keeps only the newest `--record-decisions`.
#[test]
fn recorded_decisions_replay_as_passing_scenarios_and_diff_against_another_policy() {
    let agent = Agent::start_with(&rollout_pools(), &[("--record-decisions", "5")]);
    // The first takes `single`'s only address; the rest see it exhausted.
    let (code, body) = add(&agent, "db-0", &["single"], &[]);
    assert_eq!(code, 200, "{body}");
    for (pod, v4, v6) in [
        (
            "db-1",
            &["small", "large", "single", "off", "held"][..],
            &["six"][..],
        ),
        ("db-2", &["large", "small"][..], &[][..]),
        ("db-3", &["missing-pool", "small"][..], &[][..]),
        ("db-4", &["sm*", "large"][..], &["six"][..]),
        ("db-5", &["small", "large"][..], &[][..]),
    ] {
        let (code, body) = add(&agent, pod, v4, v6);
        // db-3 names a pool that does not exist: a not-ready verdict, recorded like the rest.
        assert_eq!(code == 200, pod != "db-3", "{pod}: {code} {body}");
    }
    let ring = decisions(&agent);
    assert_eq!(ring["capacity"], 5, "{ring}");
    let seqs: Vec<u64> = ring["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5], "only the newest five are kept");

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("recorded");
    let socket = agent.socket();
    let recorded = allotctl(&[
        "policy",
        "record",
        "--socket",
        socket.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(recorded.status.success(), "{}", text(&recorded));
    let files: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
    assert_eq!(files.len(), 5, "{}", text(&recorded));
    let one = std::fs::read_to_string(out.join("00000001-team-a-db-1.yaml")).unwrap();
    for fact in [
        "allocatedIPCount",
        "recorded-reserve-held",
        "StatefulSet",
        "team-a",
    ] {
        assert!(one.contains(fact), "{fact}: {one}");
    }
    assert!(
        one.contains("exhausted") && one.contains("all-reserved") && one.contains("disabled"),
        "{one}"
    );

    // Replayed against the policy that decided (the embedded default): every one passes.
    let replay = allotctl(&["policy", "test", out.to_str().unwrap()]);
    assert!(replay.status.success(), "{}", text(&replay));
    assert!(
        text(&replay).lines().any(|l| l == "5 passed, 0 failed"),
        "{}",
        text(&replay)
    );

    // Against the zone-aware example (most free addresses first), db-5's order changes.
    let default = default_wasm();
    let zone = wasm("zone_aware.wasm");
    let diff = allotctl(&[
        "policy",
        "diff",
        "--policy",
        default.to_str().unwrap(),
        "--policy",
        zone.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    let shown = text(&diff);
    assert_eq!(diff.status.code(), Some(1), "{shown}");
    assert!(
        shown.contains("DIFFERS  ") && shown.contains("db-5.yaml"),
        "{shown}"
    );
    assert!(
        shown.contains("eth0 ipv4:")
            && shown.contains("A: chosen small")
            && shown.contains("B: chosen large"),
        "{shown}"
    );
    // The same policy twice: nothing differs.
    let same = allotctl(&[
        "policy",
        "diff",
        "--policy",
        default.to_str().unwrap(),
        "--policy",
        default.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same));
    assert!(
        text(&same).contains("0 differ, 5 same, 0 errors"),
        "{}",
        text(&same)
    );
    // A scenario that cannot be read is an error, not a difference.
    std::fs::write(out.join("broken.yaml"), "pools: [\n").unwrap();
    let broken = allotctl(&[
        "policy",
        "diff",
        "--policy",
        default.to_str().unwrap(),
        "--policy",
        zone.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    assert_eq!(broken.status.code(), Some(2), "{}", text(&broken));

    // Recording off: the agent says so and record explains how to turn it on.
    let quiet = Agent::start_with(&rollout_pools(), &[("--record-decisions", "0")]);
    let (code, _) = add(&quiet, "db-9", &["large"], &[]);
    assert_eq!(code, 200);
    assert_eq!(decisions(&quiet)["decisions"], json!([]));
    let socket = quiet.socket();
    let off = allotctl(&[
        "policy",
        "record",
        "--socket",
        socket.to_str().unwrap(),
        "--out",
        dir.path().join("none").to_str().unwrap(),
    ]);
    assert_eq!(off.status.code(), Some(2));
    assert!(text(&off).contains("--record-decisions"), "{}", text(&off));
}

/// `allotctl policy push` then `pull` round-trips a component with its digests; the agent
/// pulls it by digest and decides with it; a component the registry serves altered is refused
/// by `pull` and by the agent, which then does not start on it.
#[test]
fn a_policy_pulled_by_digest_serves_the_agent_and_an_altered_one_is_refused() {
    let registry = Registry::start();
    let zone = wasm("zone_aware.wasm");
    let target = format!("oci://{}/allot/zone-aware:v1", registry.addr);
    let pushed = allotctl(&["policy", "push", zone.to_str().unwrap(), &target]);
    assert!(pushed.status.success(), "{}", text(&pushed));
    let shown = text(&pushed);
    let pinned = shown
        .lines()
        .find(|l| l.starts_with("oci://") && l.contains("@sha256:"))
        .unwrap_or_else(|| panic!("no pinned reference in {shown}"))
        .to_string();
    let component = sha256_hex(&std::fs::read(&zone).unwrap());
    assert!(
        shown.contains(&format!("component sha256:{component}")),
        "{shown}"
    );

    let dir = tempfile::tempdir().unwrap();
    let pulled = dir.path().join("pulled.wasm");
    let out = allotctl(&["policy", "pull", &pinned, "-o", pulled.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read(&pulled).unwrap(),
        std::fs::read(&zone).unwrap()
    );

    // The agent decides with the pulled component.
    let agent = Agent::start_with(&rollout_pools(), &[("--policy", &pinned)]);
    let (code, body) = add(&agent, "db-0", &["small", "large"], &[]);
    assert_eq!(code, 200, "{body}");
    let ring = decisions(&agent);
    let last = &ring["decisions"][0];
    assert_eq!(last["sha256"], component.as_str(), "{ring}");
    assert_eq!(last["policy"], pinned.as_str(), "{ring}");
    // Zone-aware puts the pool with most free addresses first.
    assert!(body.contains("10.61.1."), "{body}");

    // A digest the registry does not hold, and a component altered in the registry's storage.
    let unknown = format!(
        "{}@sha256:{}",
        pinned.split('@').next().unwrap(),
        "0".repeat(64)
    );
    let out = allotctl(&["policy", "pull", &unknown, "-o", pulled.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let blob = registry.blob_path(&format!("sha256:{component}"));
    let mut altered = std::fs::read(&blob).unwrap();
    let n = altered.len();
    altered[n / 2] ^= 0xff;
    std::fs::write(&blob, &altered).unwrap();
    let refused = dir.path().join("refused.wasm");
    let out = allotctl(&["policy", "pull", &pinned, "-o", refused.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("does not match its digest"),
        "{}",
        text(&out)
    );
    assert!(
        !refused.exists(),
        "nothing is written for a refused component"
    );
    let start = Instant::now();
    let agent_out = Command::new(bin("allot-agent"))
        .arg("--standalone")
        .arg(agent.pools_dir())
        .args(["--policy", &pinned, "--socket"])
        .arg(dir.path().join("refused.sock"))
        .arg("--state")
        .arg(dir.path().join("refused.db"))
        .output()
        .unwrap();
    assert!(!agent_out.status.success(), "{}", text(&agent_out));
    assert!(
        text(&agent_out).contains("does not match its digest"),
        "{}",
        text(&agent_out)
    );
    assert!(start.elapsed() < Duration::from_secs(60));
}

fn sha256_hex(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, bytes).unwrap();
    let out = Command::new("sha256sum").arg(&file).output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// Cluster mode: a Policy whose source is `oci://…@sha256:…` is pulled, verified and served;
/// pointed at a component the registry serves altered, it is refused and the served one stays.
#[test]
fn a_policy_object_with_an_oci_source_is_pulled_and_an_altered_one_refused() {
    let registry = Registry::start();
    let zone = wasm("zone_aware.wasm");
    let default = default_wasm();
    let mut pinned = Vec::new();
    for (file, tag) in [(&zone, "zone"), (&default, "default")] {
        let target = format!("oci://{}/allot/policy:{tag}", registry.addr);
        let pushed = allotctl(&["policy", "push", file.to_str().unwrap(), &target]);
        assert!(pushed.status.success(), "{}", text(&pushed));
        pinned.push(
            text(&pushed)
                .lines()
                .find(|l| l.starts_with("oci://") && l.contains("@sha256:"))
                .unwrap()
                .to_string(),
        );
    }
    let Some(api) =
        KubeApi::start("a_policy_object_with_an_oci_source_is_pulled_and_an_altered_one_refused")
    else {
        return;
    };
    api.node("node-oci", json!({}), false);
    api.create(
        "ippools",
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": "p"},
               "spec": {"subnet": "10.62.0.0/24", "ips": ["10.62.0.10-10.62.0.20"], "default": true}}),
    );
    let _agent = Agent::start_on_cluster(api.admin_kubeconfig(), "node-oci", &[]);
    let policy = |oci: &str| {
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "default"},
               "spec": {"source": {"oci": oci}, "onFailure": "fail"}})
    };
    let status = || {
        api.object(ALLOT, "policies", None, "default")
            .map(|p| p["status"].clone())
            .unwrap_or_default()
    };
    let eventually = |what: &str, ok: &dyn Fn(&Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = status();
            if ok(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the Policy's status is {s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let zone_digest = format!("sha256:{}", sha256_hex(&std::fs::read(&zone).unwrap()));
    api.create("policies", policy(&pinned[0]));
    eventually("the pulled component serves", &|s| {
        s["servingDigest"] == zone_digest.as_str()
    });

    // The default's component, altered in the registry's storage: refused, zone-aware stays.
    let default_digest = format!("sha256:{}", sha256_hex(&std::fs::read(&default).unwrap()));
    let blob = registry.blob_path(&default_digest);
    let mut altered = std::fs::read(&blob).unwrap();
    altered[100] ^= 0xff;
    std::fs::write(&blob, &altered).unwrap();
    api.edit(ALLOT, "policies", None, "default", |p| {
        p["spec"]["source"]["oci"] = json!(pinned[1])
    });
    let s = eventually("the refusal", &|s| {
        s["refusedReason"]
            .as_str()
            .is_some_and(|r| r.contains("does not match its digest"))
    });
    assert_eq!(s["servingDigest"], zone_digest.as_str(), "{s}");
}
