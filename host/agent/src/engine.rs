//! The allocation engine as the agent runs it: allot-engine's [`Engine`] over whichever claim
//! store was opened, deciding with the policy registry's handle for the one cluster an agent
//! serves.

use std::sync::Arc;

use allot_core::store::Store;
use allot_engine::Engine;
use allot_policy::ClusterHandle;

/// The registry key of the one cluster an agent serves (a standalone agent's, or cluster mode's
/// cluster, whose Policy object installs under the same key).
pub const STANDALONE_CLUSTER: &str = "standalone";

pub type AgentEngine = Engine<Arc<dyn Store>, ClusterHandle>;
