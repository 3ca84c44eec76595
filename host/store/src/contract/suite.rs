//! The suite's expansion into tests ([`store_contract_tests!`](crate::store_contract_tests)), and
//! the runner of checks in sequence.

/// Expands to one `#[test]` per contract check, or to one test that runs them all in sequence.
/// See the [module documentation](crate::contract).
///
/// `in_sequence` is for a backend whose store is costly to bring up (a real API server): one
/// `setup` per test process (None skips, after saying why), a fresh location made from it
/// for each check, each check's name printed and its failure attributed ([`Sequence`]).
#[macro_export]
macro_rules! store_contract_tests {
    (location: $location:expr, open: $open:expr $(,)?) => {
        $crate::store_contract_tests!(@checks [each] [$location] [$open]);
    };
    (in_sequence: $test:ident, setup: $setup:expr, location: $location:expr, open: $open:expr $(,)?) => {
        #[test]
        fn $test() {
            let Some(fixture) = ($setup)() else {
                return;
            };
            let mut run = $crate::contract::Sequence::new(stringify!($test));
            $crate::store_contract_tests!(@checks [sequence run fixture] [$location] [$open]);
            run.finish();
        }
    };
    (@checks [$($mode:tt)*] [$location:expr] [$open:expr]) => {
        $crate::store_contract_tests!(@store [$($mode)*] [$location] [$open]
            claim_then_claims_of
            empty_batch_is_a_no_op
            claim_of_held_address_conflicts
            batch_is_all_or_nothing
            batch_naming_one_address_twice_conflicts
            released_address_can_be_claimed_again
            release_attachment_releases_only_that_attachment
            release_attachment_is_idempotent
            release_only_by_the_holder
            release_of_unclaimed_address_is_false
            detach_keeps_addresses_for_the_pod
            detach_of_nothing_is_empty
            reattach_same_pod_succeeds
            reattach_other_pod_is_stale
            reattach_twice_is_stale
            reattach_of_attached_or_missing_is_stale
            reattach_by_the_same_virtual_machine_succeeds
            reattach_by_another_holder_of_a_virtual_machines_address_is_stale
            release_detached_with_none
            release_attachment_leaves_detached_claims
            quarantine_moves_one_claim_to_the_conflict
            quarantine_of_a_free_address_is_a_detached_claim
            all_lists_everything
            ipv4_and_ipv6
            fields_round_trip
            concurrent_claims_of_one_address_have_one_winner
            concurrent_overlapping_batches_are_all_or_nothing
            concurrent_claims_of_distinct_addresses_all_succeed
            concurrent_releases_have_one_winner
            concurrent_reattach_has_one_winner
            feed_reports_every_change_in_order
            failed_writes_add_no_change
            revision_from_the_future_is_compacted
            snapshot_has_claims_releases_and_cursors
            claim_batch_with_reattach_is_all_or_nothing
            release_unchanged_keeps_changed_claims
            claims_of_pod_and_detached
        );
        $crate::store_contract_tests!(@location [$($mode)*] [$location] [$open]
            reopen_keeps_everything
            handles_on_one_location_race_safely
            handles_see_each_others_changes
            revision_survives_reopen
        );
    };
    (@store [each] [$location:expr] [$open:expr] $($check:ident)*) => {
        $(
            #[test]
            fn $check() {
                let location = ($location)();
                let open = $open;
                let store = open(&location);
                $crate::contract::$check(&store);
            }
        )*
    };
    (@location [each] [$location:expr] [$open:expr] $($check:ident)*) => {
        $(
            #[test]
            fn $check() {
                let location = ($location)();
                $crate::contract::$check(&location, $open);
            }
        )*
    };
    (@store [sequence $run:ident $fixture:ident] [$location:expr] [$open:expr] $($check:ident)*) => {
        $(
            $run.check(stringify!($check), || {
                let location = ($location)(&$fixture);
                let open = $open;
                let store = open(&location);
                $crate::contract::$check(&store);
            });
        )*
    };
    (@location [sequence $run:ident $fixture:ident] [$location:expr] [$open:expr] $($check:ident)*) => {
        $(
            $run.check(stringify!($check), || {
                let location = ($location)(&$fixture);
                $crate::contract::$check(&location, $open);
            });
        )*
    };
}

/// Runs checks one after the other in one test, printing each one's name and time; a check
/// that panics is reported and the next one runs. [`Sequence::finish`] fails the test with
/// the names and messages of those that failed.
///
/// `ALLOT_CONTRACT_CHECK=NAME[,NAME…]` runs only those checks.
pub struct Sequence {
    test: &'static str,
    only: Option<Vec<String>>,
    ran: usize,
    failed: Vec<(String, String)>,
    started: std::time::Instant,
}

impl Sequence {
    pub fn new(test: &'static str) -> Sequence {
        Sequence {
            test,
            only: std::env::var("ALLOT_CONTRACT_CHECK")
                .ok()
                .map(|v| v.split(',').map(|s| s.trim().to_string()).collect()),
            ran: 0,
            failed: Vec::new(),
            started: std::time::Instant::now(),
        }
    }

    /// Runs `check`, named `name`, unless the filter leaves it out.
    pub fn check(&mut self, name: &str, check: impl FnOnce()) {
        if self
            .only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|n| n == name))
        {
            return;
        }
        self.ran += 1;
        let started = std::time::Instant::now();
        println!("{}: {name} ...", self.test);
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)) {
            Ok(()) => println!("{}: {name} ok ({:.1?})", self.test, started.elapsed()),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "(a panic without a message)".into());
                println!("{}: {name} FAILED: {message}", self.test);
                self.failed.push((name.to_string(), message));
            }
        }
    }

    /// Fails the test when a check failed (or none ran).
    pub fn finish(self) {
        println!(
            "{}: {} check(s) in {:.1?}, {} failed",
            self.test,
            self.ran,
            self.started.elapsed(),
            self.failed.len()
        );
        assert!(
            self.ran > 0,
            "no check ran (ALLOT_CONTRACT_CHECK = {:?})",
            self.only
        );
        if !self.failed.is_empty() {
            let list: Vec<String> = self
                .failed
                .iter()
                .map(|(name, message)| format!("- {name}: {message}"))
                .collect();
            panic!(
                "{} of {} checks failed:\n{}",
                self.failed.len(),
                self.ran,
                list.join("\n")
            );
        }
    }
}
