//! Replays every committed corpus file and crash reproducer through its target, so that CI
//! catches a regression the fuzzers once found or covered, in seconds and with no fuzzer
//! installed. One test per target; a failure names the file.

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn replay(name: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = allot_fuzz::target(name).expect("a target of that name");
    let corpus = files(&root.join("corpus").join(name));
    // A corpus that went missing would make this test pass vacuously.
    assert!(
        corpus.len() >= 5,
        "fuzz/corpus/{name} holds {} files; it should hold the minimised corpus",
        corpus.len()
    );
    let crashes = files(&root.join("crashes").join(name));
    let mut failed = Vec::new();
    for file in corpus.iter().chain(&crashes) {
        let data = fs::read(file).expect("readable corpus file");
        if panic::catch_unwind(AssertUnwindSafe(|| (target.run)(&data))).is_err() {
            failed.push(
                file.strip_prefix(root)
                    .unwrap_or(file)
                    .display()
                    .to_string(),
            );
        }
    }
    assert!(failed.is_empty(), "target {name} fails on: {failed:?}");
}

#[test]
fn cni_config_corpus() {
    replay("cni_config");
}

#[test]
fn annotations_corpus() {
    replay("annotations");
}

#[test]
fn pools_corpus() {
    replay("pools");
}

#[test]
fn wire_corpus() {
    replay("wire");
}

#[test]
fn decision_corpus() {
    replay("decision");
}

#[test]
fn every_target_has_a_replay_test() {
    let names: Vec<_> = allot_fuzz::TARGETS.iter().map(|t| t.name).collect();
    assert_eq!(
        names,
        ["cni_config", "annotations", "pools", "wire", "decision"]
    );
    assert!(!allot_fuzz::run("no-such-target", b""));
}
