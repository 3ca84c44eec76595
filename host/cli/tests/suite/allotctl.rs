//! The harness as a user meets it: exit codes, the diff of a failing scenario, the summary line.

use std::path::Path;
use std::process::{Command, Output};

fn allotctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allotctl"))
        .args(args)
        .env(
            "ALLOT_CACHE_DIR",
            std::env::temp_dir().join("allotctl-test-cache"),
        )
        .output()
        .expect("running allotctl")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const PASSING: &str = r#"
description: the pool annotation picks pool-a
pools:
  - metadata: {name: pool-a}
    spec: {subnet: 10.6.0.0/24}
  - metadata: {name: pool-b}
    spec: {subnet: 10.7.0.0/24, default: true}
pod:
  annotations:
    ipam.allot.dev/ippool: '{"ipv4":["pool-a"]}'
expect:
  nics:
    eth0:
      ipv4: {rule: pool-annotation, order: [pool-a], chosen: pool-a}
"#;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn passing_and_failing_scenarios_are_counted_and_diffed() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "pass.yaml", PASSING);
    write(
        dir.path(),
        "fail.yaml",
        &PASSING.replace("chosen: pool-a", "chosen: pool-b"),
    );
    let out = allotctl(&["policy", "test", dir.path().to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("FAIL  ") && text.contains("fail.yaml"),
        "{text}"
    );
    assert!(text.contains("eth0 ipv4 chosen:"), "{text}");
    assert!(
        text.contains("- expected pool-b") && text.contains("+ actual   pool-a"),
        "{text}"
    );
    assert!(text.lines().any(|l| l == "1 passed, 1 failed"), "{text}");
}

#[test]
fn all_passing_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "pass.yaml", PASSING);
    let out = allotctl(&["policy", "test", &file]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).lines().any(|l| l == "1 passed, 0 failed"));
}

#[test]
fn explain_prints_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "pass.yaml", PASSING);
    let out = allotctl(&["policy", "explain", &file]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("ipv4: rule pool-annotation (pod annotation ipam.allot.dev/ippool)"),
        "{text}"
    );
    assert!(
        text.contains("1. pool-a (10.6.0.0/24, 254 free of 254)"),
        "{text}"
    );
    assert!(text.contains("chosen: pool-a"), "{text}");
}

#[test]
fn a_wrong_digest_refuses_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "pass.yaml", PASSING);
    let out = allotctl(&["policy", "test", "--sha256", &"ab".repeat(32), &file]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to load it"), "{err}");
}

#[test]
fn broken_scenarios_fail_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "bad-pool.yaml",
        &PASSING.replace("10.6.0.0/24", "10.6.0.0/33"),
    );
    write(dir.path(), "bad-yaml.yaml", "pools: [\n");
    let out = allotctl(&["policy", "test", dir.path().to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("subnet `10.6.0.0/33` is not a CIDR"),
        "{text}"
    );
    assert!(text.contains("not a valid scenario"), "{text}");
    assert!(text.lines().any(|l| l == "0 passed, 2 failed"), "{text}");
}

#[test]
fn no_scenarios_is_an_error_not_a_pass() {
    let dir = tempfile::tempdir().unwrap();
    let out = allotctl(&["policy", "test", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no scenario files"));
}
