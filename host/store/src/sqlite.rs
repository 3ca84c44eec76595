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
//!     network       TEXT NOT NULL       -- the CNI network (config name); GC runs per network
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
use std::fs;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use allot_core::store::{Attachment, Claim, PodRef, Store, StoreError};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, ErrorCode, OpenFlags, Transaction, TransactionBehavior, params};

/// `PRAGMA application_id` of an allot state file: "allt".
pub const APPLICATION_ID: i32 = 0x616c_6c74;

/// How long a writer waits for another process's lock before giving up.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Schema migrations: `MIGRATIONS[i]` takes a file from version `i` to `i + 1`. Append only:
/// never edit a released entry.
const MIGRATIONS: &[&str] = &[
    // 1: claims.
    "CREATE TABLE claims (
        address       TEXT PRIMARY KEY NOT NULL,
        family        INTEGER NOT NULL CHECK (family IN (4, 6)),
        pool          TEXT NOT NULL,
        container_id  TEXT,
        interface     TEXT,
        pod_namespace TEXT NOT NULL,
        pod_name      TEXT NOT NULL,
        pod_uid       TEXT NOT NULL,
        owner_kind    TEXT,
        owner_name    TEXT,
        updated_at    INTEGER NOT NULL CHECK (updated_at >= 0),
        CHECK ((container_id IS NULL) = (interface IS NULL))
    ) WITHOUT ROWID;
    CREATE INDEX claims_by_attachment ON claims (container_id, interface);
    CREATE INDEX claims_by_pod ON claims (pod_namespace, pod_name);",
    // 2: the CNI network of each claim (GC runs per network).
    "ALTER TABLE claims ADD COLUMN network TEXT NOT NULL DEFAULT '';
    CREATE INDEX claims_by_network ON claims (network);",
];

/// The schema version this build writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

const COLUMNS: &str = "address, family, pool, container_id, interface, pod_namespace, pod_name, \
                       pod_uid, owner_kind, owner_name, updated_at, network";

/// A [`Store`] on a SQLite file. See the [module documentation](self).
pub struct SqliteStore {
    path: PathBuf,
    busy_timeout: Duration,
    conn: Mutex<Connection>,
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
        let fail = |what: &str, e: rusqlite::Error| describe(&path, what, &e, busy_timeout);

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
            return Err(StoreError::Backend(format!(
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
        describe(&self.path, what, &e, self.busy_timeout)
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
                StoreError::Backend(format!("{}: {what}: {msg}", self.path.display()))
            })?;
            claims.push(claim);
        }
        claims.sort_by_key(|c| c.address);
        Ok(claims)
    }
}

impl Store for SqliteStore {
    fn claim(&self, claims: &[Claim]) -> Result<(), StoreError> {
        if claims.is_empty() {
            return Ok(());
        }
        let what = "cannot record claims";
        self.write(what, |tx| {
            let mut insert = tx
                .prepare_cached(&format!(
                    "INSERT INTO claims ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) \
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
                    ])
                    .map_err(|e| self.fail(what, e))?;
                if inserted == 0 {
                    // Dropping the transaction rolls back the claims inserted before this one.
                    return Err(StoreError::Conflict(c.address));
                }
            }
            Ok(())
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

    fn detach(&self, attachment: &Attachment, now: u64) -> Result<Vec<Claim>, StoreError> {
        let what = format!("cannot detach the claims of {attachment}");
        let now = i64::try_from(now)
            .map_err(|_| StoreError::Backend(format!("{what}: time {now} is out of range")))?;
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

    fn reattach(
        &self,
        address: IpAddr,
        pod: &PodRef,
        attachment: &Attachment,
        now: u64,
    ) -> Result<Claim, StoreError> {
        let what = format!("cannot reattach {address} to {attachment}");
        let now = seconds(address, now)?;
        self.write(&what, |tx| {
            // The pod is the same by namespace and name; its UID and owner are those of the new
            // incarnation (a restarted StatefulSet pod has a new UID, and GC compares UIDs).
            let mut claims = self.rows(
                tx,
                &what,
                &format!(
                    "UPDATE claims SET container_id = ?2, interface = ?3, pod_uid = ?6, owner_kind = ?7, \
                     owner_name = ?8, updated_at = ?9 \
                     WHERE address = ?1 AND container_id IS NULL AND interface IS NULL \
                     AND pod_namespace = ?4 AND pod_name = ?5 RETURNING {COLUMNS}"
                ),
                params![
                    address.to_string(),
                    attachment.container_id,
                    attachment.interface,
                    pod.namespace,
                    pod.name,
                    pod.uid,
                    pod.owner_kind,
                    pod.owner_name,
                    now,
                ],
            )?;
            match claims.pop() {
                Some(claim) if claims.is_empty() => Ok(claim),
                Some(_) => Err(StoreError::Backend(format!(
                    "{}: {what}: more than one row for one address",
                    self.path.display()
                ))),
                None => Err(StoreError::Stale(address)),
            }
        })
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

    fn detached_of(&self, namespace: &str, name: &str) -> Result<Vec<Claim>, StoreError> {
        let conn = self.lock();
        self.rows(
            &conn,
            &format!("cannot read the detached claims of {namespace}/{name}"),
            &format!(
                "SELECT {COLUMNS} FROM claims \
                 WHERE pod_namespace = ?1 AND pod_name = ?2 AND container_id IS NULL AND interface IS NULL"
            ),
            params![namespace, name],
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
}

fn family(address: IpAddr) -> i64 {
    match address {
        IpAddr::V4(_) => 4,
        IpAddr::V6(_) => 6,
    }
}

fn seconds(address: IpAddr, t: u64) -> Result<i64, StoreError> {
    i64::try_from(t)
        .map_err(|_| StoreError::Backend(format!("claim for {address}: time {t} is out of range")))
}

/// Creates the missing parent directories (0700) and the file (0600), so that permission
/// problems are reported with the operating system's reason rather than SQLite's "unable to
/// open database file".
fn prepare_file(path: &Path) -> Result<(), StoreError> {
    let hint = "run as root, or pass --state with a writable path";
    if path.as_os_str().is_empty() {
        return Err(StoreError::Backend(
            "the state file path is empty: pass --state with a file path".into(),
        ));
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
        && !parent.is_dir()
    {
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(parent).map_err(|e| {
            let why = match e.kind() {
                io::ErrorKind::PermissionDenied => format!("permission denied: {hint}"),
                _ => e.to_string(),
            };
            StoreError::Backend(format!(
                "cannot create the directory {} for the state file: {why}",
                parent.display()
            ))
        })?;
    }
    if path.is_dir() {
        return Err(StoreError::Backend(format!(
            "{} is a directory: pass the path of the state file (e.g. {}/claims.db)",
            path.display(),
            path.display()
        )));
    }
    let mut options = fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).map(drop).map_err(|e| {
        let why = match e.kind() {
            io::ErrorKind::PermissionDenied => format!("permission denied: {hint}"),
            io::ErrorKind::ReadOnlyFilesystem => format!("read-only file system: {hint}"),
            _ => e.to_string(),
        };
        StoreError::Backend(format!(
            "cannot open the state file {}: {why}",
            path.display()
        ))
    })
}

/// Retries `f` while SQLite reports BUSY, for at most `budget`.
fn retry_busy<T>(
    budget: Duration,
    mut f: impl FnMut() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let deadline = std::time::Instant::now() + budget;
    loop {
        match f() {
            Err(e)
                if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

fn migrate(conn: &mut Connection, path: &Path, busy_timeout: Duration) -> Result<(), StoreError> {
    let fail = |what: &str, e: rusqlite::Error| describe(path, what, &e, busy_timeout);
    let header = |conn: &Connection| -> rusqlite::Result<(i32, i32)> {
        let app: i32 = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
        let version: i32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        Ok((app, version))
    };
    // The common case, an up-to-date file, takes no write lock.
    let (app, version) = header(conn).map_err(|e| fail("cannot read the schema version", e))?;
    if app == APPLICATION_ID && version == SCHEMA_VERSION {
        return Ok(());
    }

    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| fail("cannot lock the file to set up its schema", e))?;
    // Another process may have migrated it meanwhile.
    let (app, version) = header(&tx).map_err(|e| fail("cannot read the schema version", e))?;
    if app != 0 && app != APPLICATION_ID {
        return Err(StoreError::Backend(format!(
            "{} is a SQLite database of another application (application_id {app:#x}, allot's is \
             {APPLICATION_ID:#x}): pass --state with a path of its own",
            path.display()
        )));
    }
    if !(0..=SCHEMA_VERSION).contains(&version) {
        return Err(StoreError::Backend(format!(
            "{} has schema version {version}, newer than this allot understands ({SCHEMA_VERSION}): \
             run a newer allot, or restore a backup taken before the upgrade",
            path.display()
        )));
    }
    if version == 0 {
        let tables: Vec<String> = tx
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
            .and_then(|mut stmt| stmt.query_map([], |r| r.get(0))?.collect())
            .map_err(|e| fail("cannot read the schema", e))?;
        if !tables.is_empty() {
            return Err(StoreError::Backend(format!(
                "{} is a SQLite database but not an allot state file (it has tables {}): pass \
                 --state with a path of its own",
                path.display(),
                tables.join(", ")
            )));
        }
    }
    for (from, script) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(script).map_err(|e| {
            fail(
                &format!(
                    "cannot migrate the schema from version {from} to {}",
                    from + 1
                ),
                e,
            )
        })?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .and_then(|()| tx.pragma_update(None, "application_id", APPLICATION_ID))
        .and_then(|()| tx.commit())
        .map_err(|e| fail("cannot record the schema version", e))
}

/// A message for a SQLite failure: the file, what we were doing, SQLite's words, and what the
/// operator can do about it.
fn describe(path: &Path, what: &str, e: &rusqlite::Error, busy_timeout: Duration) -> StoreError {
    let hint = match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => format!(
            "; another process holds the lock (waited up to {busy_timeout:?}): another allot \
             process, or a sqlite3 shell inside a transaction? Retry, or end the other writer"
        ),
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => "; the file is not a SQLite \
             database or is corrupt: move it aside and restore a backup (or start empty and let \
             allot rebuild claims from running pods)"
            .to_string(),
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied | ErrorCode::ReadOnly) => {
            "; permission denied or read-only: run as root, or pass --state with a writable path"
                .to_string()
        }
        Some(ErrorCode::DiskFull) => {
            "; the disk is full: free space on its file system".to_string()
        }
        Some(ErrorCode::SystemIoFailure) => {
            "; I/O error: check the disk and its file system".to_string()
        }
        _ => String::new(),
    };
    let message = format!("{}: {what}: {e}{hint}", path.display());
    match e.sqlite_error_code() {
        // Someone else's transaction: retrying later may well succeed.
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            StoreError::Unavailable(message)
        }
        _ => StoreError::Backend(message),
    }
}

/// Decodes one row of [`COLUMNS`], checking everything: the file may have been edited by hand.
fn decode(row: &rusqlite::Row<'_>) -> Result<Claim, String> {
    let raw_address = match row.get_ref(0) {
        Ok(ValueRef::Text(t)) => String::from_utf8_lossy(t).into_owned(),
        Ok(other) => format!("{other:?}"),
        Err(e) => return Err(format!("unreadable claims row: {e}")),
    };
    let at = |msg: String| {
        format!(
            "claims row {raw_address:?}: {msg}; fix or delete the row with sqlite3 \
             (DELETE FROM claims WHERE address = '{}')",
            raw_address.replace('\'', "''")
        )
    };
    let text = |idx: usize, name: &str| -> Result<Option<String>, String> {
        match row
            .get_ref(idx)
            .map_err(|e| at(format!("column {name}: {e}")))?
        {
            ValueRef::Null => Ok(None),
            ValueRef::Text(t) => std::str::from_utf8(t)
                .map(|s| Some(s.to_owned()))
                .map_err(|_| at(format!("column {name} is not valid UTF-8"))),
            other => Err(at(format!(
                "column {name} holds {:?}, expected text",
                other.data_type()
            ))),
        }
    };
    let required = |idx: usize, name: &str| {
        text(idx, name)?.ok_or_else(|| at(format!("column {name} is NULL")))
    };
    let integer = |idx: usize, name: &str| match row
        .get_ref(idx)
        .map_err(|e| at(format!("column {name}: {e}")))?
    {
        ValueRef::Integer(i) => Ok(i),
        other => Err(at(format!(
            "column {name} holds {:?}, expected an integer",
            other.data_type()
        ))),
    };

    let text_address = required(0, "address")?;
    let address: IpAddr = text_address
        .parse()
        .map_err(|_| at("the address is not an IP address".into()))?;
    if address.to_string() != text_address {
        return Err(at(format!(
            "the address is not in canonical form (expected {address}), which would defeat the \
             uniqueness check"
        )));
    }
    let fam = integer(1, "family")?;
    if fam != family(address) {
        return Err(at(format!(
            "family is {fam} but the address is IPv{}",
            family(address)
        )));
    }
    let pool = required(2, "pool")?;
    let attachment = match (text(3, "container_id")?, text(4, "interface")?) {
        (Some(container_id), Some(interface)) => Some(Attachment {
            container_id,
            interface,
        }),
        (None, None) => None,
        _ => {
            return Err(at(
                "exactly one of container_id and interface is NULL".into()
            ));
        }
    };
    let pod = PodRef {
        namespace: required(5, "pod_namespace")?,
        name: required(6, "pod_name")?,
        uid: required(7, "pod_uid")?,
        owner_kind: text(8, "owner_kind")?,
        owner_name: text(9, "owner_name")?,
    };
    let updated = integer(10, "updated_at")?;
    let updated_at =
        u64::try_from(updated).map_err(|_| at(format!("updated_at is negative ({updated})")))?;
    let network = required(11, "network")?;
    Ok(Claim {
        address,
        pool,
        network,
        attachment,
        pod,
        updated_at,
    })
}

#[cfg(test)]
mod tests {
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
        assert_eq!(SCHEMA_VERSION, 2);
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
        assert_eq!(claims[0].pool, "p");
    }
}
