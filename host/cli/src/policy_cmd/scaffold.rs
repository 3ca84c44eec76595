//! `allotctl policy new NAME`: a policy crate that builds and passes `allotctl policy test` as it
//! is. It starts as the default policy, stage for stage, so an author changes one stage at a time.
//!
//! The SDK is not on crates.io: the crate names `policies/sdk` and `policies/default` of an allot
//! checkout by path (`--allot DIR`; by default the checkout this allotctl was built from), and
//! gets a copy of the checkout's `Cargo.lock`, so it builds with the dependency versions allot is
//! tested with. A path rather than a git dependency: the SDK must match the `wit/` of the agents
//! it will run on, which a checkout of the same release guarantees, and it builds offline.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// The allot checkout this allotctl was built from (host/cli is two levels below its root).
pub fn built_from() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Creates the crate `name` in `parent/name`; returns its directory.
pub fn new_policy(parent: &Path, name: &str, allot: &Path) -> anyhow::Result<PathBuf> {
    check_name(name)?;
    let allot = allot.canonicalize().with_context(|| {
        format!(
            "the allot checkout {} cannot be read: pass --allot DIR (a checkout holding \
             policies/sdk and policies/default)",
            allot.display()
        )
    })?;
    let sdk = allot.join("policies/sdk");
    let default = allot.join("policies/default");
    for (what, dir) in [("the policy SDK", &sdk), ("the default policy", &default)] {
        if !dir.join("Cargo.toml").is_file() {
            bail!(
                "{} has no {what} ({} is missing): pass --allot DIR, a checkout of allot",
                allot.display(),
                dir.join("Cargo.toml").display()
            );
        }
    }
    let dir = parent.join(name);
    if dir.exists() && std::fs::read_dir(&dir)?.next().is_some() {
        bail!(
            "{} already exists and is not empty: choose another NAME or remove it",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir.join("src"))
        .and_then(|()| std::fs::create_dir_all(dir.join("scenarios")))
        .with_context(|| format!("creating {}", dir.display()))?;
    let type_name = type_name(name);
    let files = [
        ("Cargo.toml", cargo_toml(name, &sdk, &default)),
        ("src/lib.rs", lib_rs(name, &type_name)),
        ("scenarios/cluster-default-pools.yaml", SCENARIO.to_string()),
        ("README.md", readme(name)),
        (".gitignore", "/target\n".to_string()),
    ];
    for (file, text) in files {
        let path = dir.join(file);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let lock = allot.join("Cargo.lock");
    if lock.is_file() {
        std::fs::copy(&lock, dir.join("Cargo.lock"))
            .with_context(|| format!("copying {}", lock.display()))?;
    }
    Ok(dir)
}

/// A crate name cargo accepts, that also names a directory here and a wasm file.
fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && name.len() <= 64;
    if !ok {
        bail!(
            "{name:?} is not a usable policy name: start with a letter, then letters, digits, \
             '-' or '_' (at most 64), e.g. zone-aware"
        );
    }
    if [
        "allot-policy-sdk",
        "allot-policy-default",
        "test",
        "core",
        "std",
    ]
    .contains(&name)
    {
        bail!("{name:?} clashes with a crate the policy depends on: choose another name");
    }
    Ok(())
}

/// `my-policy` → `MyPolicy`.
fn type_name(name: &str) -> String {
    name.split(['-', '_'])
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

fn toml_path(p: &Path) -> String {
    p.display()
        .to_string()
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
}

fn cargo_toml(name: &str, sdk: &Path, default: &Path) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
# cdylib: the component (cargo build --release --target wasm32-wasip2); rlib: native unit tests.
crate-type = ["cdylib", "rlib"]

[dependencies]
# The SDK and the default policy's stages, from an allot checkout (they are not on crates.io).
# Use the checkout of the allot release your agents run: its wit/ is the contract they load.
allot-policy-sdk = {{ path = "{sdk}" }}
# Never enable its `component` feature here: it would export a second `decide`.
allot-policy-default = {{ path = "{default}" }}

# A workspace of its own: the crate builds wherever it lives.
[workspace]
"#,
        sdk = toml_path(sdk),
        default = toml_path(default),
    )
}

fn lib_rs(name: &str, type_name: &str) -> String {
    format!(
        r#"//! {name}: an allot pool-selection policy.
//!
//! It starts as the default policy, stage for stage. Replace one stage at a time, and add a
//! scenario under `scenarios/` for each behaviour you change (docs/policy-authoring.md in the
//! allot checkout).

use allot_policy_sdk::{{
    Acquisition, AddressHint, Context, DecisionError, IpFamily, Nic, Policy, Rejection,
}};

pub struct {type_name};

impl Policy for {type_name} {{
    /// Which pools are candidates for the NIC, per IP family, and by which rule.
    fn acquire(ctx: &Context, nic: &Nic) -> Result<Acquisition, DecisionError> {{
        allot_policy_default::acquire(ctx, nic)
    }}

    /// Whether pool `index` may serve the NIC, or why not.
    fn filter(ctx: &Context, nic: &Nic, family: IpFamily, index: u32) -> Result<(), Rejection> {{
        allot_policy_default::filter(ctx, nic, family, index)
    }}

    /// The survivors, best first (keep the sort stable).
    fn sort(ctx: &Context, nic: &Nic, family: IpFamily, order: &mut [u32]) {{
        allot_policy_default::sort(ctx, nic, family, order)
    }}

    /// The address the NIC must get in `family`, if the policy names one (the pod's given-address
    /// annotations, by default); `None` lets the host pick. The host honours it only inside a
    /// pool of `order`, and otherwise fails the NIC saying why: derive one from a label or an
    /// ordinal here to give pods addresses of your own.
    fn address(
        ctx: &Context,
        nic: &Nic,
        family: IpFamily,
        order: &[u32],
    ) -> Result<Option<AddressHint>, DecisionError> {{
        allot_policy_default::address(ctx, nic, family, order)
    }}
}}

allot_policy_sdk::export_policy!({type_name});
"#
    )
}

fn readme(name: &str) -> String {
    let wasm = name.replace('-', "_");
    format!(
        r#"# {name}

An allot pool-selection policy, made by `allotctl policy new {name}`.

```sh
rustup target add wasm32-wasip2          # once
cargo build --release --target wasm32-wasip2
allotctl policy test --policy target/wasm32-wasip2/release/{wasm}.wasm scenarios/
```

Then change a stage in `src/lib.rs`, add a scenario for it, and before shipping compare the new
policy with the one in service on recorded traffic (`allotctl policy record`, `allotctl policy
diff`). See docs/policy-authoring.md in the allot checkout.
"#
    )
}

/// One scenario the default stages pass: the cluster's default pools, in name order, minus a
/// disabled one.
const SCENARIO: &str = r#"description: >
  With no annotation and no namespace or CNI defaults, every pool with `default: true` is a
  candidate for its family, in name order; a disabled one is dropped.
pools:
  - metadata: {name: blue}
    spec: {subnet: 10.10.2.0/24, default: true}
  - metadata: {name: amber}
    spec: {subnet: 10.10.1.0/24, default: true}
  - metadata: {name: grey}
    spec: {subnet: 10.10.3.0/24, default: true, disable: true}
  - metadata: {name: not-default}
    spec: {subnet: 10.10.4.0/24}
namespace: {name: team-a}
node: {name: node-1}
pod: {name: web-0}
expect:
  nics:
    eth0:
      families: [ipv4]
      ipv4:
        rule: cluster-default
        candidates: [amber, blue, grey]
        order: [amber, blue]
        chosen: amber
        dropped: {grey: disabled}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_type_names_and_bad_names_are_refused() {
        assert_eq!(type_name("my-policy"), "MyPolicy");
        assert_eq!(type_name("zone_aware2"), "ZoneAware2");
        for bad in [
            "",
            "9lives",
            "../evil",
            "a/b",
            "with space",
            "allot-policy-sdk",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        check_name("zone-aware").unwrap();
    }

    #[test]
    fn a_non_empty_directory_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("p")).unwrap();
        std::fs::write(dir.path().join("p/keep"), "mine").unwrap();
        let err = new_policy(dir.path(), "p", &built_from()).unwrap_err();
        assert!(err.to_string().contains("not empty"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("p/keep")).unwrap(),
            "mine"
        );
    }
}
