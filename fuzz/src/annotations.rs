//! Target `annotations`: the SDK's annotation parsers (`allot_policy_sdk::annotations`) and the
//! wildcard matcher that pool names in annotations go through (`allot_policy_sdk::wildcard`).
//!
//! Input: the annotation key on the first line, its value after it. The value goes through
//! every parser whatever the key (they are independent of it); the key goes through `find`.
//!
//! Invariants beyond "no panic":
//! - `find` returns only `ipam.allot.dev/<name>` or `ipam.spidernet.io/<name>`, the first
//!   when both are present;
//! - accepted selections name at least one pool, no blank names or interfaces, and per-interface
//!   lists give an interface for every entry or none, never twice;
//! - accepted routes have a gateway address and a CIDR destination of the same family;
//! - `wildcard::matches` agrees with a plain dynamic-programming matcher written from the
//!   documented syntax (`*`, `?`, `[...]` with ranges and `!`/`^`; an unterminated `[` is a
//!   literal), on the value's lines (first line the pattern) and on the parsed pool names.

use allot_policy_sdk::annotations::{self, ALLOT_PREFIX, Found, SPIDERPOOL_PREFIX};
use allot_policy_sdk::types::Label;
use allot_policy_sdk::wildcard;

const NAMES: &[&str] = &[
    annotations::IPPOOL,
    annotations::IPPOOLS,
    annotations::SUBNET,
    annotations::SUBNETS,
    annotations::ROUTES,
    annotations::NS_DEFAULT_V4,
    annotations::NS_DEFAULT_V6,
    annotations::NS_DEFAULT_V4_OLD,
    annotations::NS_DEFAULT_V6_OLD,
];

/// Bounds that keep one execution fast: the reference matcher is quadratic.
const MAX_WILDCARD_CHARS: usize = 48;
const MAX_WILDCARD_NAMES: usize = 6;

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (key, value) = text.split_once('\n').unwrap_or((&text, ""));
    check_find(key, value);

    let found = Found { key, value };
    let mut names: Vec<String> = Vec::new();
    if let Ok(sel) = annotations::selection(found) {
        assert!(!sel.is_empty(), "{sel:?}");
        check_names(&sel);
        names.extend(sel.ipv4.into_iter().chain(sel.ipv6));
    }
    if let Ok(list) = annotations::selections(found) {
        assert!(!list.is_empty());
        list.iter().for_each(check_names);
        let interfaces: Vec<_> = list.iter().filter_map(|s| s.interface.as_ref()).collect();
        assert!(
            interfaces.is_empty() || interfaces.len() == list.len(),
            "{list:?}"
        );
        for (i, name) in interfaces.iter().enumerate() {
            assert!(!interfaces[..i].contains(name), "{name} twice in {list:?}");
        }
        names.extend(
            list.into_iter()
                .flat_map(|s| s.ipv4.into_iter().chain(s.ipv6)),
        );
    }
    if let Ok(list) = annotations::name_list(found) {
        assert!(list.iter().all(|n| !n.trim().is_empty()), "{list:?}");
        names.extend(list);
    }
    if let Ok(routes) = annotations::routes(found) {
        for r in routes {
            let gw: std::net::IpAddr = r.gw.parse().expect("an accepted gw is an address");
            let dst: ipnet::IpNet = r.dst.parse().expect("an accepted dst is a CIDR");
            assert_eq!(gw.is_ipv4(), dst.addr().is_ipv4(), "{} via {}", r.dst, r.gw);
        }
    }

    let lines: Vec<&str> = value.lines().take(MAX_WILDCARD_NAMES + 1).collect();
    if let Some((pattern, candidates)) = lines.split_first() {
        for name in candidates {
            check_wildcard(pattern, name);
        }
    }
    names.truncate(MAX_WILDCARD_NAMES);
    for pattern in &names {
        for name in &names {
            check_wildcard(pattern, name);
        }
    }
}

fn check_find(key: &str, value: &str) {
    let mut labels = vec![Label {
        key: key.to_owned(),
        value: value.to_owned(),
    }];
    // The same annotation under Spiderpool's prefix must lose to allot's, wherever it stands.
    if let Some(name) = key.strip_prefix(ALLOT_PREFIX) {
        labels.insert(
            0,
            Label {
                key: format!("{SPIDERPOOL_PREFIX}{name}"),
                value: "spiderpool".into(),
            },
        );
    }
    for name in NAMES {
        let Some(found) = annotations::find(&labels, name) else {
            continue;
        };
        let allot = format!("{ALLOT_PREFIX}{name}");
        if key == allot {
            assert_eq!((found.key, found.value), (key, value));
        } else {
            assert_eq!(found.key, format!("{SPIDERPOOL_PREFIX}{name}"));
        }
    }
}

fn check_names(sel: &annotations::Selection) {
    let mut names = sel.ipv4.iter().chain(&sel.ipv6);
    assert!(names.all(|n| !n.trim().is_empty()), "{sel:?}");
    assert!(
        sel.interface
            .as_deref()
            .is_none_or(|i| !i.trim().is_empty()),
        "{sel:?}"
    );
}

fn check_wildcard(pattern: &str, name: &str) {
    let p: Vec<char> = pattern.chars().take(MAX_WILDCARD_CHARS).collect();
    let n: Vec<char> = name.chars().take(MAX_WILDCARD_CHARS).collect();
    let (pattern, name): (String, String) = (p.iter().collect(), n.iter().collect());
    let got = wildcard::matches(&pattern, &name);
    assert_eq!(
        got,
        reference_matches(&p, &n),
        "matches({pattern:?}, {name:?})"
    );
    if !wildcard::is_pattern(&pattern) {
        assert_eq!(got, pattern == name, "{pattern:?} has no wildcard");
    }
}

/// `matched[i][j]`: whether `p[i..]` matches `n[j..]`, filled from the ends.
fn reference_matches(p: &[char], n: &[char]) -> bool {
    let mut matched = vec![vec![false; n.len() + 1]; p.len() + 1];
    matched[p.len()][n.len()] = true;
    for i in (0..p.len()).rev() {
        for j in (0..=n.len()).rev() {
            matched[i][j] = match p[i] {
                '*' => matched[i + 1][j] || (j < n.len() && matched[i][j + 1]),
                _ if j == n.len() => false,
                '?' => matched[i + 1][j + 1],
                '[' => match reference_class(&p[i + 1..], n[j]) {
                    Some((true, len)) => matched[i + 1 + len][j + 1],
                    Some((false, _)) => false,
                    None => n[j] == '[' && matched[i + 1][j + 1],
                },
                c => c == n[j] && matched[i + 1][j + 1],
            };
        }
    }
    matched[0][0]
}

/// The class after a `[`: whether `c` is in it and how many characters it spans up to and
/// including the closing `]`, or `None` when no `]` closes it. A `]` right after the opening
/// (or after the negation) is a member; `a-z` is a range unless the `-` is followed by `]`.
fn reference_class(body: &[char], c: char) -> Option<(bool, usize)> {
    let negated = matches!(body.first(), Some('!' | '^'));
    let start = usize::from(negated);
    let mut members: Vec<(char, char)> = Vec::new();
    let mut i = start;
    loop {
        match body.get(i..)? {
            [']', ..] if i > start => {
                let hit = members.iter().any(|&(lo, hi)| lo <= c && c <= hi);
                return Some((hit != negated, i + 1));
            }
            [lo, '-', hi, ..] if *hi != ']' => {
                members.push((*lo, *hi));
                i += 3;
            }
            [one, ..] => {
                members.push((*one, *one));
                i += 1;
            }
            [] => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_matcher_follows_the_documented_syntax() {
        let m = |p: &str, n: &str| {
            reference_matches(
                &p.chars().collect::<Vec<_>>(),
                &n.chars().collect::<Vec<_>>(),
            )
        };
        assert!(m("pool-*", "pool-a") && !m("pool-*", "pod-a"));
        assert!(m("p?ol", "pool") && !m("p?ol", "pl"));
        assert!(m("[a-c]x", "bx") && !m("[a-c]x", "dx"));
        assert!(m("[!a-c]x", "dx") && !m("[^a-c]x", "ax"));
        assert!(m("[]]", "]") && m("[a-]", "-"));
        assert!(m("[ab", "[ab") && !m("[ab", "a"));
        assert!(m("*", "") && m("**a*", "xa") && !m("a*b", "ab c"));
    }
}
