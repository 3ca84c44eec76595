//! The bodies of allot's fuzz targets, as plain functions of the input bytes.
//!
//! Each target feeds the bytes to one family of parsers or validators that take untrusted input,
//! and panics when a parser panics or when an invariant of its output does not hold. The bodies
//! live in a normal library so that `cargo nextest run --workspace` replays every committed
//! corpus file and crash reproducer (`tests/corpus.rs`) without any fuzzer installed; the AFL++
//! binary in `afl/` only wraps [`run`]. See `README.md` for the input formats and the commands.

pub mod annotations;
pub mod bytes;
pub mod cni_config;
pub mod decision;
pub mod pools;
pub mod wire;

/// A fuzz target: its name (also its corpus directory) and its body.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
}

pub const TARGETS: &[Target] = &[
    Target {
        name: "cni_config",
        run: cni_config::run,
    },
    Target {
        name: "annotations",
        run: annotations::run,
    },
    Target {
        name: "pools",
        run: pools::run,
    },
    Target {
        name: "wire",
        run: wire::run,
    },
    Target {
        name: "decision",
        run: decision::run,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// Runs target `name` on `data`; `false` when no target has that name.
pub fn run(name: &str, data: &[u8]) -> bool {
    match target(name) {
        Some(t) => {
            (t.run)(data);
            true
        }
        None => false,
    }
}
