//! Core is the bottom layer: it depends on no allot crate and on no crate that does I/O, and
//! its source reaches no file, socket, process or thread (what `src/lib.rs` promises). The
//! agent's `layers` test draws the same kind of line between the agent's modules.

use std::collections::BTreeSet;
use std::path::Path;

/// What core may build on: plain data, parsing and hashing, no I/O.
const ALLOWED: &[&str] = &[
    "ipnet",
    "serde",
    "serde_yaml",
    "sha2",
    "thiserror",
    "schemars",
];

/// The names in a `[section]` of a Cargo.toml (one `name = ...` or `name.workspace = ...` per
/// line, as this workspace writes them).
fn section(manifest: &str, name: &str) -> BTreeSet<String> {
    let mut inside = false;
    let mut names = BTreeSet::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == format!("[{name}]");
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            let key: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            names.insert(key);
        }
    }
    names
}

#[test]
fn core_depends_on_no_allot_crate_and_no_io_crate() {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let deps = section(&manifest, "dependencies");
    assert!(
        deps.contains("ipnet"),
        "the manifest was not read: {deps:?}"
    );
    let allot: Vec<_> = deps.iter().filter(|d| d.starts_with("allot")).collect();
    assert!(allot.is_empty(), "core depends on allot crates: {allot:?}");
    let other: Vec<_> = deps
        .iter()
        .filter(|d| !ALLOWED.contains(&d.as_str()))
        .collect();
    assert!(
        other.is_empty(),
        "core depends on {other:?}; core holds vocabulary, seams and pure tables: a crate \
         that does I/O or holds state belongs in a crate above it"
    );
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn core_source_reaches_no_file_socket_process_or_thread() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(files.len() > 10, "core's source was not found: {files:?}");
    let forbidden = [
        "std::fs",
        "std::process",
        "std::thread",
        "std::net::TcpStream",
        "std::net::TcpListener",
        "std::net::UdpSocket",
        "std::os::unix::net",
        "std::env::var",
    ];
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for f in forbidden {
            if text.contains(f) {
                found.push(format!(
                    "{}: {f}",
                    file.strip_prefix(&src).unwrap().display()
                ));
            }
        }
    }
    assert!(found.is_empty(), "core does I/O: {found:?}");
}
