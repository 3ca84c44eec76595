//! Wildcard pool names as users write them in annotations: `*` (any run), `?` (one character)
//! and `[...]` (a character class, with ranges `a-z` and negation `!` or `^`).

/// Whether `name` uses any wildcard syntax.
pub fn is_pattern(name: &str) -> bool {
    name.contains(['*', '?', '['])
}

/// Whether `name` matches `pattern` as a whole.
pub fn matches(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Iterative matcher with single-star backtracking: linear-ish, no recursion blow-up.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, ni));
                    pi += 1;
                    continue;
                }
                '?' => {
                    pi += 1;
                    ni += 1;
                    continue;
                }
                '[' => {
                    if let Some((matched, next)) = class(&p, pi, n[ni]) {
                        if matched {
                            pi = next;
                            ni += 1;
                            continue;
                        }
                    } else if n[ni] == '[' {
                        // An unterminated `[` is a literal.
                        pi += 1;
                        ni += 1;
                        continue;
                    }
                }
                c if c == n[ni] => {
                    pi += 1;
                    ni += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, sn)) => {
                pi = sp + 1;
                ni = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Matches `c` against the class starting at `p[start] == '['`; returns (matched, index after
/// the class), or None when the class is not terminated.
fn class(p: &[char], start: usize, c: char) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negated = matches!(p.get(i), Some('!') | Some('^'));
    if negated {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    while i < p.len() {
        if p[i] == ']' && !first {
            return Some((matched != negated, i + 1));
        }
        first = false;
        if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            if p[i] <= c && c <= p[i + 2] {
                matched = true;
            }
            i += 3;
        } else {
            if p[i] == c {
                matched = true;
            }
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_and_question_marks() {
        assert!(matches("pool-*", "pool-a"));
        assert!(matches("pool-*", "pool-"));
        assert!(!matches("pool-*", "poo"));
        assert!(matches("*-v4-*", "zone-a-v4-01"));
        assert!(matches("p?ol", "pool"));
        assert!(!matches("p?ol", "pl"));
        assert!(matches("*", ""));
        assert!(matches("a*b*c", "aXXbYYc"));
        assert!(!matches("a*b*c", "aXXbYY"));
    }

    #[test]
    fn character_classes() {
        assert!(matches("rack[0-3]", "rack2"));
        assert!(!matches("rack[0-3]", "rack7"));
        assert!(matches("rack[!0-3]", "rack7"));
        assert!(matches("rack[^0-3]", "rack7"));
        assert!(matches("pool-[ab]", "pool-b"));
        assert!(!matches("pool-[ab]", "pool-c"));
        assert!(matches("x[]]", "x]"));
        assert!(matches("x[", "x["), "an unterminated class is literal");
    }

    #[test]
    fn exact_names_are_not_patterns() {
        assert!(!is_pattern("default-v4"));
        assert!(is_pattern("default-*"));
        assert!(matches("default-v4", "default-v4"));
        assert!(!matches("default-v4", "default-v4x"));
    }
}
