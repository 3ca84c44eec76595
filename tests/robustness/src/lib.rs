//! allot's robustness simulation (issue 39, items 2 and 3): a deterministic, seeded simulator
//! that drives allot's allocation engine (the code the agent serves CNI ADD, DEL, CHECK and GC
//! with) over the real SQLite claim store, with several nodes, retries, crashes between store
//! steps, dropped replies, unavailable stores, GC racing with ADDs and exhausted pools; it
//! records a [`history::History`] of every operation, which [`checker::check`] judges per
//! address. The approach is etcd's robustness suite (`tests/robustness` in etcd-io/etcd: random
//! traffic, injected failures, a recorded history, a model checker) and Jepsen's (Knossos,
//! Elle), run in process and from one seed, as FoundationDB's simulation testing does, so that
//! every failure replays exactly. See `docs/robustness.md`.

pub mod checker;
pub mod history;
pub mod sim;
