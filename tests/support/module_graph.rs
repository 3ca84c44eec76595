//! A crate's modules as a graph of which uses which, and a check that it has no circle: the
//! layering tests of the crates that draw their modules as layers include this file (one copy
//! of the reading, each test its own lines to draw).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules of `dir` (its `.rs` files but `lib`, `main` and `mod`) → the modules among them
/// that each one's code (not its comments) names as `{prefix}MODULE`. A module's children
/// (`dir/MODULE/*.rs`) count as the module.
pub fn uses(dir: &Path, prefix: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if !["lib", "main", "mod"].contains(&name.as_str()) {
                modules.insert(name);
            }
        }
    }
    let mut graph = BTreeMap::new();
    for module in &modules {
        let mut text = std::fs::read_to_string(dir.join(format!("{module}.rs"))).unwrap();
        let children = dir.join(module);
        if children.is_dir() {
            for entry in std::fs::read_dir(children).unwrap() {
                let path = entry.unwrap().path();
                if path.is_file() {
                    text.push_str(&std::fs::read_to_string(path).unwrap());
                }
            }
        }
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let used: BTreeSet<String> = code
            .split(prefix)
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

/// Panics naming the path round a circle of `graph`, if it has one.
pub fn assert_no_circle(graph: &BTreeMap<String, BTreeSet<String>>) {
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
        visit(graph, module, &mut Vec::new(), &mut done);
    }
}
