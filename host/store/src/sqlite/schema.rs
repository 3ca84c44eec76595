//! The state file's schema and its checks: migrations, opening, decoding rows, and turning
//! SQLite's failures into messages an operator can act on.

use std::fs;
use std::io;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use allot_core::store::{Attachment, Claim, PodRef, StoreError};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, ErrorCode, TransactionBehavior};

/// `PRAGMA application_id` of an allot state file: "allt".
pub const APPLICATION_ID: i32 = 0x616c_6c74;

/// How long a writer waits for another process's lock before giving up.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Schema migrations: `MIGRATIONS[i]` takes a file from version `i` to `i + 1`. Append only:
/// never edit a released entry.
pub(crate) const MIGRATIONS: &[&str] = &[
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
    // 3: the change feed and the pools' round-robin cursors, both written by triggers, so that
    // every writer (an agent, allotctl, an operator's sqlite3 fixing a row) is seen by every
    // agent sharing the file.
    "CREATE TABLE changes (
        revision INTEGER PRIMARY KEY AUTOINCREMENT,
        address  TEXT NOT NULL,
        kind     INTEGER NOT NULL CHECK (kind IN (1, 2, 3)),
        at       INTEGER NOT NULL
    );
    CREATE INDEX changes_by_at ON changes (at);
    CREATE TABLE cursors (
        pool    TEXT PRIMARY KEY NOT NULL,
        address TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TRIGGER claims_inserted AFTER INSERT ON claims BEGIN
        INSERT INTO changes (address, kind, at) VALUES (NEW.address, 1, unixepoch());
        INSERT OR REPLACE INTO cursors (pool, address) VALUES (NEW.pool, NEW.address);
    END;
    CREATE TRIGGER claims_deleted AFTER DELETE ON claims BEGIN
        INSERT INTO changes (address, kind, at) VALUES (OLD.address, 2, unixepoch());
    END;
    CREATE TRIGGER claims_updated AFTER UPDATE ON claims BEGIN
        INSERT INTO changes (address, kind, at) VALUES (NEW.address, 3, unixepoch());
    END;",
    // 4: the node that made each claim (the CNI GC verb of a node judges its own claims only;
    // '' for claims made before, which a file serving one node treats as that node's).
    "ALTER TABLE claims ADD COLUMN node TEXT NOT NULL DEFAULT '';",
];

/// `changes.kind`: what happened to the address.
pub(crate) const CLAIMED: i64 = 1;
pub(crate) const RELEASED: i64 = 2;
pub(crate) const UPDATED: i64 = 3;

/// The schema version this build writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

pub(crate) const COLUMNS: &str = "address, family, pool, container_id, interface, pod_namespace, pod_name, \
                       pod_uid, owner_kind, owner_name, updated_at, network, node";

pub(crate) fn family(address: IpAddr) -> i64 {
    match address {
        IpAddr::V4(_) => 4,
        IpAddr::V6(_) => 6,
    }
}

pub(crate) fn seconds(address: IpAddr, t: u64) -> Result<i64, StoreError> {
    i64::try_from(t)
        .map_err(|_| StoreError::backend(format!("claim for {address}: time {t} is out of range")))
}

/// Creates the missing parent directories (0700) and the file (0600), so that permission
/// problems are reported with the operating system's reason rather than SQLite's "unable to
/// open database file".
pub(crate) fn prepare_file(path: &Path) -> Result<(), StoreError> {
    let hint = "run as root, or pass --state with a writable path";
    if path.as_os_str().is_empty() {
        return Err(StoreError::backend(
            "the state file path is empty: pass --state with a file path",
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
            StoreError::backend_caused(
                format!(
                    "cannot create the directory {} for the state file: {why}",
                    parent.display()
                ),
                e,
            )
        })?;
    }
    if path.is_dir() {
        return Err(StoreError::backend(format!(
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
        StoreError::backend_caused(
            format!("cannot open the state file {}: {why}", path.display()),
            e,
        )
    })
}

/// Retries `f` while SQLite reports BUSY, for at most `budget`.
pub(crate) fn retry_busy<T>(
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

pub(crate) fn migrate(
    conn: &mut Connection,
    path: &Path,
    busy_timeout: Duration,
) -> Result<(), StoreError> {
    let fail = |what: &str, e: rusqlite::Error| describe(path, what, e, busy_timeout);
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
        return Err(StoreError::backend(format!(
            "{} is a SQLite database of another application (application_id {app:#x}, allot's is \
             {APPLICATION_ID:#x}): pass --state with a path of its own",
            path.display()
        )));
    }
    if !(0..=SCHEMA_VERSION).contains(&version) {
        return Err(StoreError::backend(format!(
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
            return Err(StoreError::backend(format!(
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
pub(crate) fn describe(
    path: &Path,
    what: &str,
    e: rusqlite::Error,
    busy_timeout: Duration,
) -> StoreError {
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
            StoreError::unavailable_caused(message, e)
        }
        _ => StoreError::backend_caused(message, e),
    }
}

/// Decodes one row of [`COLUMNS`], checking everything: the file may have been edited by hand.
pub(crate) fn decode(row: &rusqlite::Row<'_>) -> Result<Claim, String> {
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
    let node = required(12, "node")?;
    Ok(Claim {
        address,
        pool,
        network,
        attachment,
        pod,
        node,
        updated_at,
    })
}
