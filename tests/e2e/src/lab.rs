//! The lab: a host namespace, an agent and a plugin directory, torn down on drop.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{
    Agent, Attachment, Cni, CniOutput, Netns, PluginDir, allot_ipam, bridge_conf, skip, unique_name,
};

/// Everything one test needs: a host namespace for bridges and plugins, an agent, a CNI_PATH.
pub struct Lab {
    pub agent: Agent,
    /// Where the main plugins run, so bridges, veths and gateway addresses stay out of the
    /// machine's own namespace.
    pub host: Netns,
    pub plugins: PluginDir,
    /// A bridge name for this lab's bridge network (created by the bridge plugin).
    pub bridge: String,
    /// The network name of this lab's bridge network.
    pub network: String,
}

impl Lab {
    /// `None` (after printing `SKIP: test: reason`) when this machine cannot run e2e tests;
    /// else a lab whose agent serves `pools` (YAML documents).
    pub fn new(test: &str, pools: &str) -> Option<Lab> {
        Self::with_agent(test, || Agent::start(pools))
    }

    /// Like [`Lab::new`], with agent flags replacing the lab's defaults.
    pub fn with_flags(test: &str, pools: &str, flags: &[(&str, &str)]) -> Option<Lab> {
        Self::with_agent(test, || Agent::start_with(pools, flags))
    }

    /// Like [`Lab::new`], with the agent on an existing pools directory.
    pub fn on_pools_dir(test: &str, pools_dir: &Path) -> Option<Lab> {
        Self::with_agent(test, || Agent::start_on(pools_dir))
    }

    /// Like [`Lab::new`], with the agent in cluster mode on the API server of `kubeconfig`.
    pub fn on_cluster(
        test: &str,
        kubeconfig: &Path,
        node: &str,
        flags: &[(&str, &str)],
    ) -> Option<Lab> {
        Self::with_agent(test, || Agent::start_on_cluster(kubeconfig, node, flags))
    }

    /// Like [`Lab::new`], with the agent serving the pools kept in the etcd at `url`.
    pub fn on_etcd_pools(test: &str, url: &str) -> Option<Lab> {
        Self::with_agent(test, || Agent::start_on_etcd_pools(url))
    }

    /// Like [`Lab::with_flags`], with the agent running in the lab's host namespace, as a
    /// node's agent runs in the node's.
    pub fn in_host(test: &str, pools: &str, flags: &[(&str, &str)]) -> Option<Lab> {
        if skip(test) {
            return None;
        }
        let plugins = PluginDir::new();
        let host = Netns::new();
        let agent = Agent::start_in(&host, pools, flags);
        Some(Lab {
            agent,
            host,
            plugins,
            bridge: unique_name("br"),
            network: "allot-e2e".into(),
        })
    }

    fn with_agent(test: &str, start: impl FnOnce() -> Agent) -> Option<Lab> {
        if skip(test) {
            return None;
        }
        let plugins = PluginDir::new();
        let host = Netns::new();
        let agent = start();
        Some(Lab {
            agent,
            host,
            plugins,
            bridge: unique_name("br"),
            network: "allot-e2e".into(),
        })
    }

    /// This lab's bridge network (CNI 1.0.0) with allot and the given default pools.
    pub fn bridge_conf(&self, v4: &[&str], v6: &[&str]) -> Value {
        self.bridge_conf_via(&self.agent.socket(), v4, v6)
    }

    /// This lab's bridge network with allot asking the agent on `socket` (another agent
    /// sharing the lab's store: another node).
    pub fn bridge_conf_via(&self, socket: &Path, v4: &[&str], v6: &[&str]) -> Value {
        bridge_conf(
            "1.0.0",
            &self.network,
            &self.bridge,
            allot_ipam(socket, v4, v6),
        )
    }

    /// Polls `holds` until it is true; panics with the agent's log after `within`.
    #[track_caller]
    pub fn eventually(&self, what: &str, within: Duration, mut holds: impl FnMut() -> bool) {
        let deadline = Instant::now() + within;
        while !holds() {
            assert!(
                Instant::now() < deadline,
                "{what}: not after {within:?}; agent log:\n{}",
                self.agent.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `plugin` (`bridge`, `macvlan`, `allot`, ...) with `command` for `att` in the host
    /// namespace.
    pub fn cni(&self, plugin: &str, command: &str, att: &Attachment, config: &Value) -> CniOutput {
        Cni::new(&self.plugins, plugin, command, &config.to_string())
            .attachment(att)
            .run(Some(&self.host))
    }

    /// A bare invocation (no attachment variables) for custom environments.
    pub fn call(&self, plugin: &str, command: &str, config: &str) -> Cni {
        Cni::new(&self.plugins, plugin, command, config)
    }

    /// ADD through the bridge plugin; panics unless it succeeds. Returns the result.
    #[track_caller]
    pub fn bridge_add(&self, att: &Attachment, config: &Value) -> CniOutput {
        let out = self.cni("bridge", "ADD", att, config);
        out.expect_ok();
        out
    }
}
