//! The agent's modules draw as layers: no module uses one that uses it back, however far round
//! (what `src/lib.rs` draws). A module's children (`node/add.rs`) count as the module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module → the modules of this crate its source names as `crate::MODULE`.
fn uses() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if name != "lib" && name != "main" {
                modules.insert(name);
            }
        }
    }
    let mut graph = BTreeMap::new();
    for module in &modules {
        let mut text = std::fs::read_to_string(src.join(format!("{module}.rs"))).unwrap();
        let children = src.join(module);
        if children.is_dir() {
            for entry in std::fs::read_dir(children).unwrap() {
                text.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
            }
        }
        let used: BTreeSet<String> = text
            .split("crate::")
            .skip(1)
            .filter_map(|rest| {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                (modules.contains(&name) && name != *module).then_some(name)
            })
            .collect();
        graph.insert(module.clone(), used);
    }
    graph
}

#[test]
fn no_module_uses_one_that_uses_it_back() {
    let graph = uses();
    assert!(graph.contains_key("node") && graph["server"].contains("node"));
    // Depth-first search for a cycle, reporting the path round it.
    fn visit(
        graph: &BTreeMap<String, BTreeSet<String>>,
        module: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if let Some(at) = path.iter().position(|m| m == module) {
            panic!("a circle: {} -> {module}", path[at..].join(" -> "));
        }
        if done.contains(module) {
            return;
        }
        path.push(module.to_string());
        for next in &graph[module] {
            visit(graph, next, path, done);
        }
        path.pop();
        done.insert(module.to_string());
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        visit(&graph, module, &mut Vec::new(), &mut done);
    }
}
