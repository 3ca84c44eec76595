//! allot-k8s is the one door to k8s-openapi: no other allot crate depends on it or names it,
//! so the Kubernetes version is chosen in one place (see the crate's doc). The test-support
//! crates that stand in for or drive a real cluster (tests/apiserver, tests/lab, tests/cluster)
//! are not allot's layers and choose the version for themselves.

use std::path::{Path, PathBuf};

/// The crates held to the rule: every allot crate under host/, and the end-to-end suite.
fn crates(workspace: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(workspace.join("host"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").exists() && !p.ends_with("k8s"))
        .collect();
    out.push(workspace.join("tests/e2e"));
    out.push(workspace.join("fuzz"));
    out.sort();
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_other_allot_crate_depends_on_or_names_k8s_openapi() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let crates = crates(&workspace);
    assert!(crates.len() > 5, "the workspace was not found: {crates:?}");
    let mut found = Vec::new();
    for krate in &crates {
        let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap();
        if manifest
            .lines()
            .any(|l| l.trim_start().starts_with("k8s-openapi"))
        {
            found.push(format!("{}/Cargo.toml", krate.display()));
        }
        let mut files = Vec::new();
        for dir in ["src", "tests", "benches", "examples"] {
            rust_files(&krate.join(dir), &mut files);
        }
        for file in files {
            if std::fs::read_to_string(&file)
                .unwrap()
                .contains("k8s_openapi")
            {
                found.push(file.display().to_string());
            }
        }
    }
    assert!(
        found.is_empty(),
        "import Kubernetes' types as allot_k8s::openapi, not from k8s-openapi: {found:#?}"
    );
}
