//! The embedded backend: claims as rows of one SQLite file.
//!
//! # Why SQLite
//!
//! - **Operators can look inside.** The state is one ordinary file that `sqlite3` opens:
//!   `sqlite3 /var/lib/allot/allot.db 'SELECT * FROM claims'` answers "who holds 10.0.0.7?"
//!   without allot running, and a wrong row can be fixed by hand in an emergency.
//! - **Transactional.** A batch of claims is one transaction; the `PRIMARY KEY` on the address is
//!   the create-if-absent, so a conflict rolls the whole batch back. Reads-then-writes are single
//!   `UPDATE … RETURNING` / `DELETE … RETURNING` statements inside `BEGIN IMMEDIATE`.
//! - **One file, many processes.** SQLite's file locking serialises writers from every process
//!   that opens the file (agent, `allotctl`, a CNI `GC` run), and `busy_timeout` makes a writer
//!   wait for the lock instead of failing.
//! - **WAL.** Readers never block the writer and the writer never blocks readers; with
//!   `synchronous=FULL` every committed transaction is fsynced to the WAL before `COMMIT`
//!   returns, so a claim that was reported as made survives `kill -9` and power loss.
//!
//! # Layout
//!
//! ```sql
//! CREATE TABLE claims (
//!     address       TEXT PRIMARY KEY,   -- canonical text of the IpAddr ("10.0.0.7", "2001:db8::7")
//!     family        INTEGER NOT NULL,   -- 4 or 6
//!     pool          TEXT NOT NULL,
//!     container_id  TEXT,               -- container_id and interface are both NULL
//!     interface     TEXT,               --   exactly when the claim is detached
//!     pod_namespace TEXT NOT NULL, pod_name TEXT NOT NULL, pod_uid TEXT NOT NULL,
//!     owner_kind    TEXT, owner_name TEXT,
//!     updated_at    INTEGER NOT NULL,   -- unix seconds
//!     network       TEXT NOT NULL,      -- the CNI network (config name); GC runs per network
//!     node          TEXT NOT NULL       -- the node that made the claim ('' before it was kept)
//! ) WITHOUT ROWID;
//! ```
//!
//! with indexes on `(container_id, interface)` and `(pod_namespace, pod_name)`. The schema
//! version is `PRAGMA user_version` ([`SCHEMA_VERSION`]); `PRAGMA application_id` is
//! [`APPLICATION_ID`] so that allot refuses to write into somebody else's database. Migrations
//! are an ordered list of SQL scripts applied in one transaction at open.
//!
//! Addresses are stored in their canonical text form (Rust's `Display`: dotted quad, RFC 5952
//! for IPv6), which is what makes the primary key a uniqueness check on addresses. A row whose
//! address does not parse, or is not canonical (a hand edit such as `2001:DB8::1`), is reported
//! as an error naming the row rather than silently allowing a second claim of the same address.
//!
//! Within one process, calls share one connection behind a mutex; across processes, SQLite's
//! locks do the work. Lists are returned ordered by address.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use allot_core::store::{
    Attachment, Change, ChangeKind, Changes, Claim, PodRef, Reattach, Snapshot, Store, StoreError,
    Taken, VIRTUAL_MACHINE_KIND,
};
use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior, params};
mod schema;

pub use schema::{APPLICATION_ID, DEFAULT_BUSY_TIMEOUT, SCHEMA_VERSION};
use schema::{COLUMNS, decode, describe, family, migrate, prepare_file, retry_busy, seconds};

/// A [`Store`] on a SQLite file. See the [module documentation](self).
pub struct SqliteStore {
    path: PathBuf,
    busy_timeout: Duration,
    conn: Mutex<Connection>,
    /// Writes so far, to compact the change feed now and then.
    writes: Mutex<u64>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("busy_timeout", &self.busy_timeout)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating it, and its missing parent directories with mode 0700, if needed) the
    /// state file at `path`, and brings its schema up to date.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with_busy_timeout(path, DEFAULT_BUSY_TIMEOUT)
    }

    /// [`open`](Self::open), waiting at most `busy_timeout` for another process's lock on each
    /// operation.
    pub fn open_with_busy_timeout(
        path: impl AsRef<Path>,
        busy_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        prepare_file(&path)?;
        let fail = |what: &str, e: rusqlite::Error| describe(&path, what, e, busy_timeout);

        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn =
            Connection::open_with_flags(&path, flags).map_err(|e| fail("cannot open", e))?;
        conn.busy_timeout(busy_timeout)
            .map_err(|e| fail("cannot set busy_timeout", e))?;

        // Changing the journal mode needs the file to itself for a moment; a concurrent opener
        // can make it fail with BUSY without the busy handler being consulted, so retry.
        let mode = retry_busy(busy_timeout, || {
            conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
        })
        .map_err(|e| fail("cannot read the file as a SQLite database", e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::backend(format!(
                "{}: cannot switch to write-ahead logging (journal mode stays {mode:?}); the file \
                 system may not support the shared memory SQLite needs (NFS?): keep the state \
                 file on a local disk",
                path.display()
            )));
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| fail("cannot set synchronous=FULL", e))?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(|e| fail("cannot enable foreign keys", e))?;

        migrate(&mut conn, &path, busy_timeout)?;

        Ok(Self {
            path,
            busy_timeout,
            conn: Mutex::new(conn),
            writes: Mutex::new(0),
        })
    }

    /// The state file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock dropped (rolled back) any open transaction, so the
        // connection is still consistent.
        self.conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn fail(&self, what: &str, e: rusqlite::Error) -> StoreError {
        describe(&self.path, what, e, self.busy_timeout)
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction: commits if it returns `Ok`, rolls back if it
    /// returns `Err`.
    fn write<T>(
        &self,
        what: &str,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.fail(what, e))?;
        let out = f(&tx)?;
        tx.commit().map_err(|e| self.fail(what, e))?;
        Ok(out)
    }

    /// Runs one statement that yields claim rows (a `SELECT` or a `… RETURNING`), decoding every
    /// row; any undecodable row fails the whole call.
    fn rows(
        &self,
        conn: &Connection,
        what: &str,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<Claim>, StoreError> {
        let mut stmt = conn.prepare_cached(sql).map_err(|e| self.fail(what, e))?;
        let mut rows = stmt.query(params).map_err(|e| self.fail(what, e))?;
        let mut claims = Vec::new();
        while let Some(row) = rows.next().map_err(|e| self.fail(what, e))? {
            let claim = decode(row).map_err(|msg| {
                StoreError::backend(format!("{}: {what}: {msg}", self.path.display()))
            })?;
            claims.push(claim);
        }
        claims.sort_by_key(|c| c.address);
        Ok(claims)
    }
}

impl SqliteStore {
    fn insert_claims(
        &self,
        tx: &Transaction<'_>,
        what: &str,
        claims: &[Claim],
    ) -> Result<(), StoreError> {
        if claims.is_empty() {
            return Ok(());
        }
        let mut insert = tx
            .prepare_cached(&format!(
                "INSERT INTO claims ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) \
                 ON CONFLICT (address) DO NOTHING"
            ))
            .map_err(|e| self.fail(what, e))?;
        for c in claims {
            let (container_id, interface) = match &c.attachment {
                Some(a) => (Some(a.container_id.as_str()), Some(a.interface.as_str())),
                None => (None, None),
            };
            let inserted = insert
                .execute(params![
                    c.address.to_string(),
                    family(c.address),
                    c.pool,
                    container_id,
                    interface,
                    c.pod.namespace,
                    c.pod.name,
                    c.pod.uid,
                    c.pod.owner_kind,
                    c.pod.owner_name,
                    seconds(c.address, c.updated_at)?,
                    c.network,
                    c.node,
                ])
                .map_err(|e| self.fail(what, e))?;
            if inserted == 0 {
                // Dropping the transaction rolls back everything written before this one.
                return Err(StoreError::Conflict(c.address));
            }
        }
        Ok(())
    }

    /// Runs `f` in a read transaction: every query sees the same committed state.
    fn read<T>(
        &self,
        what: &str,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Deferred)
            .map_err(|e| self.fail(what, e))?;
        let out = f(&tx)?;
        tx.finish().map_err(|e| self.fail(what, e))?;
        Ok(out)
    }

    /// The revision of the last change ever recorded (0 for none).
    fn revision(&self, tx: &Transaction<'_>, what: &str) -> Result<u64, StoreError> {
        tx.query_row(
            "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'changes'), 0)",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n.max(0) as u64)
        .map_err(|e| self.fail(what, e))
    }

    /// Forgets changes older than [`CHANGE_RETENTION`] now and then (always keeping the last
    /// one, so the revision stays readable): a reader further behind resyncs from a snapshot.
    fn compact(&self, tx: &Transaction<'_>, what: &str) -> Result<(), StoreError> {
        let mut writes = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        *writes += 1;
        if !(*writes).is_multiple_of(COMPACT_EVERY) {
            return Ok(());
        }
        tx.execute(
            "DELETE FROM changes WHERE at < unixepoch() - ?1 \
             AND revision < (SELECT max(revision) FROM changes)",
            params![CHANGE_RETENTION.as_secs() as i64],
        )
        .map(drop)
        .map_err(|e| self.fail(what, e))
    }
}

/// How long the change feed remembers (longer than any cooldown; a reader behind resyncs).
pub const CHANGE_RETENTION: Duration = Duration::from_secs(3600);

/// Writes between two compactions of the change feed.
const COMPACT_EVERY: u64 = 256;

impl Store for SqliteStore {
    fn claim_batch(
        &self,
        fresh: &[Claim],
        reattach: &[Reattach],
    ) -> Result<Vec<Claim>, StoreError> {
        if fresh.is_empty() && reattach.is_empty() {
            return Ok(Vec::new());
        }
        let what = "cannot record claims";
        self.write(what, |tx| {
            self.insert_claims(tx, what, fresh)?;
            let mut out = Vec::with_capacity(reattach.len());
            for r in reattach {
                // The holder is the same (PodRef::same_holder): the pod by namespace and name,
                // or the virtual machine of a launcher pod; its name, UID and owner are those
                // of the new incarnation (a restarted StatefulSet pod has a new UID, and GC
                // compares UIDs).
                let mut claims = self.rows(
                    tx,
                    what,
                    &format!(
                        "UPDATE claims SET container_id = ?2, interface = ?3, pod_name = ?5, \
                         pod_uid = ?6, owner_kind = ?7, owner_name = ?8, updated_at = ?9, node = ?10, \
                         network = ?12 \
                         WHERE address = ?1 AND container_id IS NULL AND interface IS NULL \
                         AND pod_namespace = ?4 AND (pod_name = ?5 OR (owner_kind = ?11 \
                         AND ?7 = ?11 AND owner_name = ?8 AND owner_name != '')) \
                         RETURNING {COLUMNS}"
                    ),
                    params![
                        r.address.to_string(),
                        r.attachment.container_id,
                        r.attachment.interface,
                        r.pod.namespace,
                        r.pod.name,
                        r.pod.uid,
                        r.pod.owner_kind,
                        r.pod.owner_name,
                        seconds(r.address, r.now)?,
                        r.node,
                        VIRTUAL_MACHINE_KIND,
                        r.network,
                    ],
                )?;
                match claims.pop() {
                    Some(claim) if claims.is_empty() => out.push(claim),
                    Some(_) => {
                        return Err(StoreError::backend(format!(
                            "{}: {what}: more than one row for {}",
                            self.path.display(),
                            r.address
                        )));
                    }
                    None => return Err(StoreError::Stale(r.address)),
                }
            }
            self.compact(tx, what)?;
            Ok(out)
        })
    }

    fn release_attachment(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        let what = format!("cannot release the claims of {attachment}");
        self.write(&what, |tx| {
            self.rows(
                tx,
                &what,
                &format!("DELETE FROM claims WHERE container_id = ?1 AND interface = ?2 RETURNING {COLUMNS}"),
                params![attachment.container_id, attachment.interface],
            )
        })
    }

    fn release(
        &self,
        address: IpAddr,
        attachment: Option<&Attachment>,
    ) -> Result<bool, StoreError> {
        let what = format!("cannot release {address}");
        self.write(&what, |tx| {
            // `IS` compares NULLs as equal: with no attachment this matches detached claims only.
            let deleted = tx
                .prepare_cached("DELETE FROM claims WHERE address = ?1 AND container_id IS ?2 AND interface IS ?3")
                .and_then(|mut stmt| {
                    stmt.execute(params![
                        address.to_string(),
                        attachment.map(|a| a.container_id.as_str()),
                        attachment.map(|a| a.interface.as_str()),
                    ])
                })
                .map_err(|e| self.fail(&what, e))?;
            Ok(deleted > 0)
        })
    }

    fn release_unchanged(&self, claims: &[Claim]) -> Result<Vec<Claim>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let what = format!("cannot release {} claims", claims.len());
        self.write(&what, |tx| {
            let mut out = Vec::new();
            for c in claims {
                let (container_id, interface) = match &c.attachment {
                    Some(a) => (Some(a.container_id.as_str()), Some(a.interface.as_str())),
                    None => (None, None),
                };
                out.extend(self.rows(
                    tx,
                    &what,
                    &format!(
                        "DELETE FROM claims WHERE address = ?1 AND container_id IS ?2 AND interface IS ?3 \
                         AND pod_uid = ?4 AND updated_at = ?5 RETURNING {COLUMNS}"
                    ),
                    params![
                        c.address.to_string(),
                        container_id,
                        interface,
                        c.pod.uid,
                        seconds(c.address, c.updated_at)?,
                    ],
                )?);
            }
            self.compact(tx, &what)?;
            Ok(out)
        })
    }

    fn detach(&self, attachment: &Attachment, now: u64) -> Result<Vec<Claim>, StoreError> {
        let what = format!("cannot detach the claims of {attachment}");
        let now = i64::try_from(now)
            .map_err(|_| StoreError::backend(format!("{what}: time {now} is out of range")))?;
        self.write(&what, |tx| {
            self.rows(
                tx,
                &what,
                &format!(
                    "UPDATE claims SET container_id = NULL, interface = NULL, updated_at = ?3 \
                     WHERE container_id = ?1 AND interface = ?2 RETURNING {COLUMNS}"
                ),
                params![attachment.container_id, attachment.interface, now],
            )
        })
    }

    fn quarantine(
        &self,
        address: IpAddr,
        attachment: &Attachment,
        holder: &PodRef,
        now: u64,
    ) -> Result<Claim, StoreError> {
        let what = format!("cannot quarantine {address}");
        let now = i64::try_from(now)
            .map_err(|_| StoreError::backend(format!("{what}: time {now} is out of range")))?;
        let mut moved = self.write(&what, |tx| {
            self.rows(
                tx,
                &what,
                &format!(
                    "UPDATE claims SET container_id = NULL, interface = NULL, pod_namespace = ?4, \
                     pod_name = ?5, pod_uid = ?6, owner_kind = ?7, owner_name = ?8, updated_at = ?9 \
                     WHERE address = ?1 AND container_id = ?2 AND interface = ?3 RETURNING {COLUMNS}"
                ),
                params![
                    address.to_string(),
                    attachment.container_id,
                    attachment.interface,
                    holder.namespace,
                    holder.name,
                    holder.uid,
                    holder.owner_kind,
                    holder.owner_name,
                    now
                ],
            )
        })?;
        moved.pop().ok_or(StoreError::Stale(address))
    }

    fn claims_of(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        let conn = self.lock();
        self.rows(
            &conn,
            &format!("cannot read the claims of {attachment}"),
            &format!("SELECT {COLUMNS} FROM claims WHERE container_id = ?1 AND interface = ?2"),
            params![attachment.container_id, attachment.interface],
        )
    }

    fn claims_of_pod(&self, namespace: &str, name: &str) -> Result<Vec<Claim>, StoreError> {
        let conn = self.lock();
        self.rows(
            &conn,
            &format!("cannot read the claims of pod {namespace}/{name}"),
            &format!("SELECT {COLUMNS} FROM claims WHERE pod_namespace = ?1 AND pod_name = ?2"),
            params![namespace, name],
        )
    }

    fn claims_of_virtual_machine(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<Claim>, StoreError> {
        let conn = self.lock();
        self.rows(
            &conn,
            &format!("cannot read the claims of virtual machine {namespace}/{name}"),
            &format!(
                "SELECT {COLUMNS} FROM claims WHERE pod_namespace = ?1 AND owner_kind = ?2 \
                 AND owner_name = ?3"
            ),
            params![namespace, VIRTUAL_MACHINE_KIND, name],
        )
    }

    fn detached(&self) -> Result<Vec<Claim>, StoreError> {
        let conn = self.lock();
        self.rows(
            &conn,
            "cannot read the detached claims",
            &format!("SELECT {COLUMNS} FROM claims WHERE container_id IS NULL"),
            [],
        )
    }

    fn all(&self) -> Result<Vec<Claim>, StoreError> {
        let conn = self.lock();
        self.rows(
            &conn,
            "cannot read claims",
            &format!("SELECT {COLUMNS} FROM claims"),
            [],
        )
    }

    fn snapshot(&self, released_since: u64) -> Result<Snapshot, StoreError> {
        let what = "cannot read a snapshot of the claims";
        let since = i64::try_from(released_since).unwrap_or(i64::MAX);
        self.read(what, |tx| {
            let revision = self.revision(tx, what)?;
            let claims = self.rows(tx, what, &format!("SELECT {COLUMNS} FROM claims"), [])?;
            let pairs =
                |sql: &str, arg: Option<i64>| -> Result<Vec<(String, String, i64)>, StoreError> {
                    let mut stmt = tx.prepare_cached(sql).map_err(|e| self.fail(what, e))?;
                    let map = |r: &rusqlite::Row<'_>| Ok((r.get(0)?, r.get(1)?, r.get(2)?));
                    let rows = match arg {
                        Some(a) => stmt.query_map(params![a], map),
                        None => stmt.query_map([], map),
                    };
                    rows.and_then(|rows| rows.collect())
                        .map_err(|e| self.fail(what, e))
                };
            // Released in the window and not claimed since: cooling down.
            let released = pairs(
                "SELECT address, '', max(at) FROM changes WHERE kind = 2 AND at >= ?1 \
                 AND address NOT IN (SELECT address FROM claims) GROUP BY address",
                Some(since),
            )?
            .into_iter()
            .filter_map(|(a, _, at)| Some((a.parse().ok()?, u64::try_from(at).ok()?)))
            .collect();
            let cursors = pairs("SELECT pool, address, 0 FROM cursors", None)?
                .into_iter()
                .filter_map(|(p, a, _)| Some((p, a.parse().ok()?)))
                .collect();
            Ok(Snapshot {
                revision,
                claims: Taken::of_all(&claims),
                released,
                cursors,
            })
        })
    }

    fn changes_since(&self, revision: u64) -> Result<Changes, StoreError> {
        let what = "cannot read the change feed";
        self.read(what, |tx| {
            let current = self.revision(tx, what)?;
            if revision > current {
                // A revision of another file (the state file was replaced): start over.
                return Ok(Changes::Compacted);
            }
            if revision == current {
                return Ok(Changes::Since {
                    changes: Vec::new(),
                    revision,
                });
            }
            let oldest: Option<i64> = tx
                .query_row("SELECT min(revision) FROM changes", [], |r| r.get(0))
                .map_err(|e| self.fail(what, e))?;
            if oldest.is_none_or(|o| o as u64 > revision + 1) {
                return Ok(Changes::Compacted);
            }
            let mut stmt = tx
                .prepare_cached(
                    "SELECT revision, address, kind, at FROM changes WHERE revision > ?1 ORDER BY revision",
                )
                .map_err(|e| self.fail(what, e))?;
            let rows: Vec<(i64, String, i64, i64)> = stmt
                .query_map(params![revision as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })
                .and_then(|rows| rows.collect())
                .map_err(|e| self.fail(what, e))?;
            let mut changes = Vec::with_capacity(rows.len());
            for (rev, address, kind, at) in rows {
                let address = address.parse::<IpAddr>().map_err(|e| {
                    StoreError::backend_caused(
                        format!(
                            "{}: {what}: change {rev} names {address:?}, not an address; delete \
                             the row (DELETE FROM changes WHERE revision = {rev})",
                            self.path.display()
                        ),
                        e,
                    )
                })?;
                let kind = match kind {
                    schema::CLAIMED => ChangeKind::Claimed,
                    schema::RELEASED => ChangeKind::Released,
                    schema::UPDATED => ChangeKind::Updated,
                    other => {
                        return Err(StoreError::backend(format!(
                            "{}: {what}: change {rev} has kind {other}",
                            self.path.display()
                        )));
                    }
                };
                changes.push(Change {
                    revision: rev as u64,
                    address,
                    kind,
                    at: u64::try_from(at).unwrap_or(0),
                });
            }
            Ok(Changes::Since { changes, revision: current })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::schema::MIGRATIONS;
    use super::*;

    #[test]
    fn connection_settings() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("claims.db")).unwrap();
        let conn = store.lock();
        let get = |pragma: &str| -> String {
            conn.query_row(&format!("PRAGMA {pragma}"), [], |r| {
                r.get::<_, rusqlite::types::Value>(0)
            })
            .map(|v| match v {
                rusqlite::types::Value::Integer(i) => i.to_string(),
                rusqlite::types::Value::Text(t) => t,
                other => format!("{other:?}"),
            })
            .unwrap()
        };
        assert_eq!(get("journal_mode"), "wal");
        assert_eq!(get("synchronous"), "2", "synchronous must be FULL (2)");
        assert_eq!(get("foreign_keys"), "1");
        assert_eq!(
            get("busy_timeout"),
            DEFAULT_BUSY_TIMEOUT.as_millis().to_string()
        );
        assert_eq!(get("user_version"), SCHEMA_VERSION.to_string());
        assert_eq!(get("application_id"), APPLICATION_ID.to_string());
    }

    #[test]
    fn schema_version_counts_migrations() {
        assert_eq!(SCHEMA_VERSION as usize, MIGRATIONS.len());
        assert_eq!(SCHEMA_VERSION, 4);
    }

    #[test]
    fn a_version_1_file_is_migrated_keeping_its_claims() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = 1;
                 INSERT INTO claims VALUES ('10.0.0.7', 4, 'p', 'c1', 'eth0', 'ns', 'pod', 'u', NULL, NULL, 5);"
            ))
            .unwrap();
        }
        let store = SqliteStore::open(&path).unwrap();
        let claims = store.all().unwrap();
        assert_eq!(claims.len(), 1);
        assert_eq!(
            claims[0].network, "",
            "claims from before networks were recorded"
        );
        assert_eq!(claims[0].node, "", "claims from before nodes were recorded");
        assert_eq!(claims[0].pool, "p");
    }
}
