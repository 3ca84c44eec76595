//! Kubernetes LabelSelector matching: `matchLabels` and `matchExpressions` (In, NotIn, Exists,
//! DoesNotExist), all ANDed. An empty selector matches everything.

use crate::types::{Label, LabelSelector, SelectorOperator};

/// The value of `key` among `labels`.
pub fn get<'a>(labels: &'a [Label], key: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|l| l.key == key)
        .map(|l| l.value.as_str())
}

pub fn matches(selector: &LabelSelector, labels: &[Label]) -> bool {
    selector
        .match_labels
        .iter()
        .all(|want| get(labels, &want.key) == Some(want.value.as_str()))
        && selector.match_expressions.iter().all(|req| {
            let value = get(labels, &req.key);
            match req.operator {
                SelectorOperator::In => value.is_some_and(|v| req.values.iter().any(|w| w == v)),
                // Kubernetes: NotIn also matches when the key is absent.
                SelectorOperator::NotIn => {
                    !value.is_some_and(|v| req.values.iter().any(|w| w == v))
                }
                SelectorOperator::Exists => value.is_some(),
                SelectorOperator::DoesNotExist => value.is_none(),
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::SelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> Vec<Label> {
        pairs
            .iter()
            .map(|(k, v)| Label {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect()
    }

    fn req(key: &str, operator: SelectorOperator, values: &[&str]) -> SelectorRequirement {
        SelectorRequirement {
            key: key.into(),
            operator,
            values: values.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn empty_selector_matches_everything() {
        let sel = LabelSelector {
            match_labels: vec![],
            match_expressions: vec![],
        };
        assert!(matches(&sel, &[]));
        assert!(matches(&sel, &labels(&[("a", "b")])));
    }

    #[test]
    fn match_labels_need_every_pair() {
        let sel = LabelSelector {
            match_labels: labels(&[("app", "web"), ("tier", "front")]),
            match_expressions: vec![],
        };
        assert!(matches(
            &sel,
            &labels(&[("app", "web"), ("tier", "front"), ("x", "y")])
        ));
        assert!(!matches(&sel, &labels(&[("app", "web")])));
        assert!(!matches(&sel, &labels(&[("app", "web"), ("tier", "back")])));
    }

    #[test]
    fn expressions_follow_kubernetes_semantics() {
        let l = labels(&[("zone", "a"), ("gpu", "")]);
        let one = |r| LabelSelector {
            match_labels: vec![],
            match_expressions: vec![r],
        };
        assert!(matches(
            &one(req("zone", SelectorOperator::In, &["a", "b"])),
            &l
        ));
        assert!(!matches(
            &one(req("zone", SelectorOperator::In, &["c"])),
            &l
        ));
        assert!(!matches(
            &one(req("missing", SelectorOperator::In, &["a"])),
            &l
        ));
        assert!(matches(
            &one(req("zone", SelectorOperator::NotIn, &["c"])),
            &l
        ));
        assert!(!matches(
            &one(req("zone", SelectorOperator::NotIn, &["a"])),
            &l
        ));
        assert!(matches(
            &one(req("missing", SelectorOperator::NotIn, &["a"])),
            &l
        ));
        assert!(matches(&one(req("gpu", SelectorOperator::Exists, &[])), &l));
        assert!(!matches(
            &one(req("missing", SelectorOperator::Exists, &[])),
            &l
        ));
        assert!(matches(
            &one(req("missing", SelectorOperator::DoesNotExist, &[])),
            &l
        ));
        assert!(!matches(
            &one(req("gpu", SelectorOperator::DoesNotExist, &[])),
            &l
        ));
    }
}
