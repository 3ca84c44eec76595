//! The configuration in force: what the last reload installed (pools, subnets and reserved
//! addresses), what it held back and why, as `GET /v1/status` and the metrics report it.

use std::sync::Mutex;

use allot_api::ConfigProblem;
use allot_core::config::{InForce, Problem};

/// What the agent last made of its configuration.
#[derive(Default)]
pub struct ConfigState {
    /// The versions in force (what the engine serves).
    pub in_force: InForce,
    /// Objects not (entirely) in force, and why.
    pub problems: Vec<Problem>,
    /// Files that could not be read completely, and why.
    pub incomplete: Vec<(String, String)>,
    /// Why the last reload installed nothing at all (the directory unreadable, the store
    /// failing), if it did.
    pub failure: Option<String>,
    /// The fingerprint of the pools' source the last reload read (the inventory's).
    pub loaded_from: Option<u64>,
}

impl ConfigState {
    /// Whether what is in force differs from what the files say, or the last reload failed:
    /// reloads are retried every tick until it is not.
    pub fn degraded(&self) -> bool {
        !self.problems.is_empty() || !self.incomplete.is_empty() || self.failure.is_some()
    }

    /// Everything wrong, as `GET /v1/status` lists it.
    pub fn listed(&self) -> Vec<ConfigProblem> {
        let mut out: Vec<ConfigProblem> = self
            .incomplete
            .iter()
            .map(|(file, why)| ConfigProblem {
                kind: "File".into(),
                name: file.clone(),
                state: "incomplete".into(),
                reason: why.clone(),
            })
            .collect();
        out.extend(self.problems.iter().map(|p| ConfigProblem {
            kind: p.kind.to_string(),
            name: p.name.clone(),
            state: p.state.as_str().into(),
            reason: p.reason.clone(),
        }));
        if let Some(why) = &self.failure {
            out.push(ConfigProblem {
                kind: "Reload".into(),
                name: String::new(),
                state: "failed".into(),
                reason: why.clone(),
            });
        }
        out
    }
}

pub type SharedConfig = Mutex<ConfigState>;

/// The state, whatever a panicking holder left (it is replaced whole at each reload).
pub fn lock(config: &SharedConfig) -> std::sync::MutexGuard<'_, ConfigState> {
    config.lock().unwrap_or_else(|p| p.into_inner())
}
