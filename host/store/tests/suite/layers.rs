//! The store's modules draw as layers: no module uses one that uses it back, however far round,
//! neither among the crate's modules nor among the Kubernetes store's (`src/kubernetes/`),
//! where the decoded block (`compact::Block`) lives with the compact form the mirror keeps, so
//! that the mirror uses `compact` and not the other way round.

use std::path::Path;

#[path = "../../../../tests/support/module_graph.rs"]
mod module_graph;
use module_graph::{assert_no_circle, uses};

#[test]
fn no_module_uses_one_that_uses_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert_no_circle(&uses(&src, "crate::"));
    let kubernetes = uses(&src.join("kubernetes"), "super::");
    assert!(kubernetes["mirror"].contains("compact"), "{kubernetes:?}");
    assert_no_circle(&kubernetes);
}
