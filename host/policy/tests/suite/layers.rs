//! The policy host's modules draw as layers: no module uses one that uses it back, however far
//! round (the agent's `layers` test draws the same line). The contract's bindings, their
//! conversions (`contract/convert.rs`) and the state its host imports act on (`HostState`)
//! live in `contract`; the runtime uses the contract, never the other way round.

use std::path::Path;

#[path = "../../../../tests/support/module_graph.rs"]
mod module_graph;
use module_graph::{assert_no_circle, uses};

#[test]
fn no_module_uses_one_that_uses_it_back() {
    let graph = uses(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        "crate::",
    );
    assert!(graph["runtime"].contains("contract"), "{graph:?}");
    assert_no_circle(&graph);
}
