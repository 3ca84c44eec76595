//! The operations pages' flag tables say what the binaries do: every flag a table names exists
//! in its binary's `--help`, with the default and the environment variable the table gives, and
//! every flag of `allot-agent` and `allot-controller` is in some table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use allot_e2e::bin;

/// One option of a binary's `--help`: its default and environment variable, if any.
#[derive(Debug, Default)]
struct Option_ {
    takes_value: bool,
    default: Option<String>,
    env: Option<String>,
}

fn help(binary: &str) -> BTreeMap<String, Option_> {
    let out = std::process::Command::new(bin(binary))
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("{binary} --help: {e}: build it first (cargo build --release)"));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut options = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed
            .strip_prefix("--")
            .filter(|_| line.starts_with("      --"))
        {
            let name = rest.split([' ', '<']).next().unwrap().to_string();
            options.insert(
                name.clone(),
                Option_ {
                    takes_value: rest.contains('<'),
                    ..Option_::default()
                },
            );
            current = Some(name);
            continue;
        }
        let Some(name) = &current else { continue };
        let option = options.get_mut(name).unwrap();
        if let Some(d) = bracketed(trimmed, "[default: ") {
            option.default = Some(d);
        }
        if let Some(e) = bracketed(trimmed, "[env: ") {
            option.env = Some(e.trim_end_matches('=').to_string());
        }
    }
    options.remove("help");
    options.remove("version");
    options
}

/// The text of `[PREFIX…]` in `line` (brackets inside it nest: `[default: [::]:9402]`).
fn bracketed(line: &str, prefix: &str) -> Option<String> {
    let at = line.find(prefix)? + prefix.len();
    let mut depth = 1;
    for (i, c) in line[at..].char_indices() {
        match c {
            '[' => depth += 1,
            ']' if depth == 1 => return Some(line[at..at + i].to_string()),
            ']' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// A table row: the flags its first cell names, its environment variables, and its default.
#[derive(Debug)]
struct Row {
    page: String,
    line: String,
    flags: Vec<String>,
    envs: Vec<String>,
    default: Option<String>,
}

fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// A table line's cells; a `|` inside `code` separates nothing.
fn cells(line: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut code = false;
    for c in line.trim().trim_matches('|').chars() {
        match c {
            '`' => {
                code = !code;
                cells.last_mut().unwrap().push(c);
            }
            '|' if !code => cells.push(String::new()),
            c => cells.last_mut().unwrap().push(c),
        }
    }
    cells.into_iter().map(|c| c.trim().to_string()).collect()
}

/// The rows naming flags in the tables of `page`.
fn rows(page: &str) -> Vec<Row> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(page);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut out = Vec::new();
    let mut header: Option<Vec<String>> = None;
    for line in text.lines() {
        if !line.starts_with('|') {
            header = None;
            continue;
        }
        let cells = cells(line);
        let Some(columns) = &header else {
            header = Some(cells.iter().map(|c| c.to_lowercase()).collect());
            continue;
        };
        if cells[0].starts_with("---") {
            continue;
        }
        let names = backticked(&cells[0]);
        let flags: Vec<String> = names
            .iter()
            .filter_map(|n| n.strip_prefix("--"))
            .map(|n| n.split(' ').next().unwrap().to_string())
            .collect();
        if flags.is_empty() {
            continue;
        }
        let mut envs: Vec<String> = names
            .iter()
            .filter(|n| n.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
            .cloned()
            .collect();
        let column = |name: &str| columns.iter().position(|c| c.starts_with(name));
        if let Some(cell) = column("env").and_then(|i| cells.get(i)) {
            envs.extend(backticked(cell));
        }
        out.push(Row {
            page: page.to_string(),
            line: line.to_string(),
            flags,
            envs,
            default: column("default").and_then(|i| cells.get(i).cloned()),
        });
    }
    out
}

/// `--flag`'s documented default against its help, where the table says one plainly: a number,
/// a `code` value, `off` for a switch; several flags' defaults comma-separated in one row.
fn check_default(row: &Row, help: &BTreeMap<String, Option_>, problems: &mut Vec<String>) {
    let Some(cell) = &row.default else { return };
    let values: Vec<&str> = cell.split(", ").collect();
    if values.len() != row.flags.len() {
        return;
    }
    for (flag, value) in row.flags.iter().zip(values) {
        let Some(option) = help.get(flag) else {
            continue;
        };
        let plain = value.trim_matches('`');
        let documented = if value == "off" {
            if option.takes_value && option.default.as_deref() != Some("false") {
                problems.push(format!(
                    "{}: --{flag} is documented `off` but takes a value: {}",
                    row.page, row.line
                ));
            }
            continue;
        } else if plain.parse::<f64>().is_ok() || (value.starts_with('`') && value.ends_with('`')) {
            plain
        } else {
            continue;
        };
        if option.default.as_deref() != Some(documented) {
            problems.push(format!(
                "{}: --{flag} defaults to {:?} in --help, the table says {documented:?}",
                row.page, option.default
            ));
        }
    }
}

fn check(binary: &str, pages: &[&str]) {
    let help = help(binary);
    assert!(help.len() > 10, "{binary} --help parsed: {help:?}");
    let mut problems = Vec::new();
    let mut documented = BTreeSet::new();
    for page in pages {
        for row in rows(page) {
            for flag in &row.flags {
                match help.get(flag) {
                    None => problems.push(format!(
                        "{page}: --{flag} is not an option of {binary}: {}",
                        row.line
                    )),
                    Some(option) => {
                        documented.insert(flag.clone());
                        if row.flags.len() == 1
                            && let Some(env) = row.envs.first()
                            && option.env.as_deref() != Some(env.as_str())
                        {
                            problems.push(format!(
                                "{page}: --{flag}'s environment variable is {:?} in --help, the table says {env}",
                                option.env
                            ));
                        }
                    }
                }
            }
            check_default(&row, &help, &mut problems);
        }
    }
    for flag in help.keys() {
        if !documented.contains(flag) {
            problems.push(format!(
                "{binary} --{flag} is in no flag table of {}",
                pages.join(", ")
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_agents_flag_tables_are_its_help() {
    check(
        "allot-agent",
        &["agent.md", "stores.md", "cluster-mode.md", "probing.md"],
    );
}

#[test]
fn the_controllers_flag_tables_are_its_help() {
    check(
        "allot-controller",
        &["controller.md", "webhooks.md", "fleet.md"],
    );
}
