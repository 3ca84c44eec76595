//! What a [`Store`](super::Store) call fails with.

use std::error::Error;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use super::Claim;

/// The error underneath a [`StoreError::Backend`] or [`StoreError::Unavailable`]: SQLite's,
/// etcd's, the API server's, an I/O error. Shared, so that [`StoreError`] stays `Clone` (the engine hands one error to every
/// waiter of a batch); a trait object, so that core names no backend's crate.
pub type Cause = Arc<dyn Error + Send + Sync + 'static>;

#[derive(Debug, Clone)]
pub enum StoreError {
    /// Create-if-absent lost: the address is already claimed. Nothing was written.
    Conflict(IpAddr),
    /// The claim changed under us (released or re-attached by someone else). Nothing was written.
    Stale(IpAddr),
    /// The backend is busy or unreachable for now (a held lock, a lost connection): retrying
    /// later may succeed. Nothing was written. `source` as for [`StoreError::Backend`].
    Unavailable {
        message: String,
        source: Option<Cause>,
    },
    /// The backend failed; the message says what and, where it can, what to do. `source` is the
    /// error underneath, when there is one: callers that must tell causes apart downcast
    /// [`Error::source`] (it is the cause itself, not a wrapper). The message already says the
    /// cause in words for the operator, as it always has: [`report`] prints no further.
    Backend {
        message: String,
        source: Option<Cause>,
    },
    /// A release or detach of claims the backend keeps in several objects (the Kubernetes
    /// store writes each IPBlock by its own compare-and-swap: an IPv4 and an IPv6 address are
    /// always two) was written for the claims in `done` and failed for the rest with `rest`
    /// (never itself `Partial`). Releases and detaches are idempotent: the same call again
    /// completes it and touches nothing `done` names, so a caller retries it as it would after
    /// `rest` (the agent's DEL journal, GC's next pass).
    Partial {
        done: Vec<Claim>,
        rest: Box<StoreError>,
    },
}

impl StoreError {
    /// What failed, setting aside what a [`StoreError::Partial`] did: the error to decide on
    /// (retry later, or report) as if nothing had been written.
    pub fn failure(&self) -> &StoreError {
        match self {
            StoreError::Partial { rest, .. } => rest.failure(),
            other => other,
        }
    }

    /// The claims written before the call failed: a [`StoreError::Partial`]'s, else none.
    pub fn done(&self) -> &[Claim] {
        match self {
            StoreError::Partial { done, .. } => done,
            _ => &[],
        }
    }

    /// The backend busy or unreachable, with no error underneath (a timeout of allot's own, a
    /// write lost to other writers).
    pub fn unavailable(message: impl Into<String>) -> StoreError {
        StoreError::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// The backend busy or unreachable, as `source` says; `message` quotes it, as users read it.
    pub fn unavailable_caused(
        message: impl Into<String>,
        source: impl Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::Unavailable {
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// A backend failure with no error underneath (a check of the backend's own).
    pub fn backend(message: impl Into<String>) -> StoreError {
        StoreError::Backend {
            message: message.into(),
            source: None,
        }
    }

    /// A backend failure caused by `source`; `message` says what failed (quoting `source`, as
    /// users read it) and what to do.
    pub fn backend_caused(
        message: impl Into<String>,
        source: impl Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::Backend {
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Conflict(address) => write!(f, "address {address} is already claimed"),
            StoreError::Stale(address) => write!(f, "claim for {address} changed concurrently"),
            StoreError::Unavailable { message, .. } => write!(f, "store unavailable: {message}"),
            StoreError::Backend { message, .. } => write!(f, "store: {message}"),
            StoreError::Partial { done, rest } => {
                let addresses: Vec<String> = done.iter().map(|c| c.address.to_string()).collect();
                write!(
                    f,
                    "{rest} (the claims of {} were written already; the same call again completes it)",
                    addresses.join(", ")
                )
            }
        }
    }
}

/// Written out rather than derived: `source` is the cause itself (`&*arc`), which a derive
/// would hand out as the `Arc` around it, so that downcasting to the cause's type would fail.
impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            StoreError::Unavailable {
                source: Some(cause),
                ..
            }
            | StoreError::Backend {
                source: Some(cause),
                ..
            } => Some(&**cause),
            StoreError::Partial { rest, .. } => Some(&**rest),
            _ => None,
        }
    }
}

/// Errors compare by what they say: two backend failures with one message are one failure to
/// whoever compares them (results in tests, a retry deciding whether anything changed), and
/// their causes could not be compared anyway (`dyn Error` has no equality).
impl PartialEq for StoreError {
    fn eq(&self, other: &StoreError) -> bool {
        use StoreError::*;
        match (self, other) {
            (Conflict(a), Conflict(b)) | (Stale(a), Stale(b)) => a == b,
            (Unavailable { message: a, .. }, Unavailable { message: b, .. })
            | (Backend { message: a, .. }, Backend { message: b, .. }) => a == b,
            (Partial { done: a, rest: x }, Partial { done: b, rest: y }) => a == b && x == y,
            _ => false,
        }
    }
}

impl Eq for StoreError {}

/// `error` and its causes on one line, each after a colon as anyhow's `{:#}` writes them, down to
/// the first [`StoreError`]: a store error's message already says what failed underneath, in
/// words for the operator, and keeps that error as its source for callers that match on it, not
/// to print it twice. What the binaries print when they stop on an error.
pub fn report(error: &(dyn Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut at = error;
    while !at.is::<StoreError>()
        && let Some(cause) = at.source()
    {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        at = cause;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_error_says_what_it_said_and_keeps_its_cause() {
        let cause = "x".parse::<u8>().unwrap_err();
        let e = StoreError::backend_caused(format!("row 7: {cause}"), cause.clone());
        assert_eq!(e.to_string(), format!("store: row 7: {cause}"));
        let source = e.source().expect("the cause is kept");
        assert_eq!(
            source.downcast_ref::<std::num::ParseIntError>(),
            Some(&cause)
        );
        assert_eq!(e.clone(), StoreError::backend(format!("row 7: {cause}")));
        assert_ne!(e, StoreError::backend("row 8"));
        assert!(StoreError::backend("no cause").source().is_none());
        let busy = StoreError::unavailable_caused("locked: x", "x".parse::<u8>().unwrap_err());
        assert_eq!(busy.to_string(), "store unavailable: locked: x");
        assert!(busy.source().is_some());
        assert_ne!(busy, StoreError::backend("locked: x"));
    }

    #[derive(Debug)]
    struct Opening(StoreError);

    impl fmt::Display for Opening {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("opening the store")
        }
    }

    impl Error for Opening {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_report_stops_at_a_store_error_which_says_its_cause_itself() {
        let cause = "x".parse::<u8>().unwrap_err();
        let e = Opening(StoreError::backend_caused(format!("row 7: {cause}"), cause));
        assert_eq!(
            report(&e),
            "opening the store: store: row 7: invalid digit found in string"
        );
        let plain = "x".parse::<u8>().unwrap_err();
        assert_eq!(report(&plain), plain.to_string());
    }
}
