//! `SqliteStore` against the shared store contract, plus what only the SQLite backend promises:
//! several processes on one file, claims surviving `kill -9`, clear errors for bad files.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use allot_core::store::{Claim, Store, StoreError};
use allot_store::SqliteStore;
use allot_store::contract::{attachment, claim, ip, pod};
use allot_store::sqlite::{APPLICATION_ID, SCHEMA_VERSION};
use rusqlite::Connection;

mod contract {
    use allot_store::SqliteStore;

    allot_store::store_contract_tests! {
        location: || tempfile::tempdir().expect("temp dir"),
        open: |dir: &tempfile::TempDir| SqliteStore::open(dir.path().join("claims.db")).expect("open"),
    }
}

const T0: u64 = 1_700_000_000;

fn backend_error<T: std::fmt::Debug>(r: Result<T, StoreError>) -> String {
    match r {
        Err(StoreError::Backend { message, .. }) => message,
        other => panic!("expected a backend error, got {other:?}"),
    }
}

fn open_error(path: &Path) -> String {
    backend_error(SqliteStore::open(path))
}

// ---------------------------------------------------------------------------------------------
// Several processes on one file. The children are this test binary again, running
// `helper_child_process` with its instructions in the environment.

const CHILD_MODE: &str = "ALLOT_STORE_TEST_CHILD";
const CHILD_DB: &str = "ALLOT_STORE_TEST_DB";
const CHILD_ID: &str = "ALLOT_STORE_TEST_ID";
const CHILD_GO: &str = "ALLOT_STORE_TEST_GO";

fn race_addresses() -> Vec<IpAddr> {
    (0..64)
        .map(|i| {
            if i % 2 == 0 {
                ip(&format!("10.200.0.{i}"))
            } else {
                ip(&format!("fd00:200::{i:x}"))
            }
        })
        .collect()
}

fn child(mode: &str, db: &Path, id: usize, go: &Path) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "sqlite_contract::helper_child_process",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_MODE, mode)
    .env(CHILD_DB, db)
    .env(CHILD_ID, id.to_string())
    .env(CHILD_GO, go)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    cmd
}

/// Not a test by itself: the body of the child processes of the tests below. Does nothing when
/// run directly.
#[test]
fn helper_child_process() {
    let Ok(mode) = std::env::var(CHILD_MODE) else {
        return;
    };
    let db = PathBuf::from(std::env::var(CHILD_DB).expect("db"));
    let id: usize = std::env::var(CHILD_ID).expect("id").parse().expect("id");
    let go = PathBuf::from(std::env::var(CHILD_GO).expect("go"));
    let store = SqliteStore::open(&db).expect("child opens the store");
    let me = attachment(&format!("proc-{id}"), "eth0");
    let p = pod("race", &format!("proc-{id}"), &format!("uid-{id}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !go.exists() {
        assert!(Instant::now() < deadline, "no go signal");
        std::thread::sleep(Duration::from_millis(1));
    }
    match mode.as_str() {
        "race" => {
            for address in race_addresses() {
                match store.claim(&[Claim {
                    address,
                    ..claim("10.0.0.0", "race", Some(&me), &p, T0)
                }]) {
                    Ok(()) => println!("WON {address}"),
                    Err(StoreError::Conflict(a)) if a == address => {}
                    Err(e) => panic!("child {id}: claim of {address}: {e}"),
                }
            }
        }
        "claim-forever" => {
            // Pairs of addresses, one batch each, reported once committed; the parent kills us.
            for i in 0u32.. {
                let v4 = IpAddr::from([10, 201, (i >> 8) as u8, i as u8]);
                let v6 = IpAddr::from([0xfd00, 0x201, 0, 0, 0, 0, (i >> 16) as u16, i as u16]);
                let mk = |address| Claim {
                    address,
                    ..claim("10.0.0.0", "kill", Some(&me), &p, T0)
                };
                store.claim(&[mk(v4), mk(v6)]).expect("claim");
                println!("COMMITTED {v4} {v6}");
            }
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// Four processes claim the same addresses from one file: each address is won exactly once,
/// and the file holds it for the winner.
#[test]
fn processes_racing_on_one_file_have_one_winner_per_address() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claims.db");
    let go = dir.path().join("go");
    let children: Vec<_> = (0..4)
        .map(|id| child("race", &db, id, &go).spawn().expect("spawn child"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    std::fs::write(&go, b"").unwrap();

    let mut winners: BTreeMap<IpAddr, usize> = BTreeMap::new();
    for (id, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().expect("child output");
        assert!(out.status.success(), "child {id} failed: {:?}", out.status);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((_, address)) = line.split_once("WON ") {
                let previous = winners.insert(ip(address), id);
                assert!(
                    previous.is_none(),
                    "{address} won by processes {previous:?} and {id}"
                );
            }
        }
    }
    let expected: BTreeMap<IpAddr, usize> = race_addresses()
        .into_iter()
        .map(|a| (a, winners[&a]))
        .collect();
    assert_eq!(winners, expected, "every address has a winner");

    let stored: BTreeMap<IpAddr, usize> = SqliteStore::open(&db)
        .unwrap()
        .all()
        .unwrap()
        .into_iter()
        .map(|c| {
            let holder = c.attachment.expect("attached").container_id;
            (
                c.address,
                holder.strip_prefix("proc-").unwrap().parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        stored, winners,
        "the file holds each address for the process that won it"
    );
}

/// A process killed with SIGKILL while claiming loses nothing it reported committed, and leaves
/// no half batch behind.
#[test]
fn claims_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claims.db");
    let go = dir.path().join("go");
    std::fs::write(&go, b"").unwrap();
    let mut c = child("claim-forever", &db, 0, &go)
        .spawn()
        .expect("spawn child");
    let mut committed = Vec::new();
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    while committed.len() < 40 {
        let line = lines.next().expect("child output ended early").unwrap();
        if let Some((_, rest)) = line.split_once("COMMITTED ") {
            let (v4, v6) = rest.split_once(' ').unwrap();
            committed.push((ip(v4), ip(v6)));
        }
    }
    c.kill().unwrap(); // SIGKILL, mid-stream
    c.wait().unwrap();
    for line in lines {
        if let Some((_, rest)) = line.unwrap().split_once("COMMITTED ") {
            let (v4, v6) = rest.split_once(' ').unwrap();
            committed.push((ip(v4), ip(v6)));
        }
    }

    let store = SqliteStore::open(&db).expect("reopen after kill -9");
    let stored: Vec<IpAddr> = store
        .all()
        .unwrap()
        .into_iter()
        .map(|c| c.address)
        .collect();
    for (v4, v6) in &committed {
        assert!(
            stored.contains(v4) && stored.contains(v6),
            "committed batch {v4} {v6} was lost"
        );
    }
    let (v4s, v6s): (Vec<IpAddr>, Vec<IpAddr>) = stored.iter().partition(|a| a.is_ipv4());
    assert_eq!(v4s.len(), v6s.len(), "no half batches");
    for v4 in v4s {
        let IpAddr::V4(v4) = v4 else { unreachable!() };
        let [_, _, hi, lo] = v4.octets();
        let v6 = IpAddr::from([0xfd00, 0x201, 0, 0, 0, 0, 0, u16::from_be_bytes([hi, lo])]);
        assert!(v6s.contains(&v6), "batch of {v4} is complete");
    }
}

// ---------------------------------------------------------------------------------------------
// Several stores in one process.

/// Two independently opened stores on one file, each used by eight threads, race for the same
/// addresses: exactly one winner per address.
#[test]
fn two_stores_on_one_file_have_one_winner_per_address() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claims.db");
    let stores = [
        SqliteStore::open(&db).unwrap(),
        SqliteStore::open(&db).unwrap(),
    ];
    let addresses = race_addresses();
    let barrier = std::sync::Barrier::new(16);
    let results: Vec<Vec<bool>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|t| {
                let (store, barrier, addresses) = (&stores[t % 2], &barrier, &addresses);
                s.spawn(move || {
                    let me = attachment(&format!("t{t}"), "eth0");
                    barrier.wait();
                    addresses
                        .iter()
                        .map(|&address| {
                            match store.claim(&[Claim {
                                address,
                                ..claim("10.0.0.0", "p", Some(&me), &pod("ns", "p", "u"), T0)
                            }]) {
                                Ok(()) => true,
                                Err(StoreError::Conflict(a)) if a == address => false,
                                Err(e) => panic!("thread {t}: {e}"),
                            }
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, address) in addresses.iter().enumerate() {
        let won = results.iter().filter(|r| r[i]).count();
        assert_eq!(won, 1, "{address} has {won} winners");
    }
    assert_eq!(stores[0].all().unwrap(), stores[1].all().unwrap());
    assert_eq!(stores[0].all().unwrap().len(), addresses.len());
}

/// Many stores opening a new file at the same moment all succeed (schema set up once).
#[test]
fn concurrent_opens_of_a_new_file_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("new/claims.db");
    let barrier = std::sync::Barrier::new(8);
    let stores: Vec<SqliteStore> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (db, barrier) = (&db, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    SqliteStore::open(db)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().expect("concurrent open"))
            .collect()
    });
    for (i, store) in stores.iter().enumerate() {
        let a = attachment(&format!("c{i}"), "eth0");
        store
            .claim(&[claim(
                &format!("10.0.0.{i}"),
                "p",
                Some(&a),
                &pod("ns", "p", "u"),
                T0,
            )])
            .unwrap();
    }
    assert_eq!(stores[0].all().unwrap().len(), 8);
}

/// A writer waits for another process's lock (within busy_timeout) instead of failing.
#[test]
fn writers_wait_for_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claims.db");
    let store = SqliteStore::open(&db).unwrap();
    let (locked, is_locked) = std::sync::mpsc::channel();
    let waited = std::thread::scope(|s| {
        let db = &db;
        s.spawn(move || {
            let mut raw = Connection::open(db).unwrap();
            let tx = raw
                .transaction_with_behavior(rusqlite::TransactionBehavior::Exclusive)
                .unwrap();
            locked.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            tx.commit().unwrap();
        });
        is_locked.recv().unwrap();
        let started = Instant::now();
        let a = attachment("c1", "eth0");
        store
            .claim(&[claim("10.0.0.1", "p", Some(&a), &pod("ns", "p", "u"), T0)])
            .expect("claim waits for the lock");
        started.elapsed()
    });
    assert!(
        waited >= Duration::from_millis(200),
        "the claim waited for the lock ({waited:?})"
    );
}

/// A lock held past busy_timeout is an error that says what is going on.
#[test]
fn lock_held_too_long_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claims.db");
    let store = SqliteStore::open_with_busy_timeout(&db, Duration::from_millis(100)).unwrap();
    let mut raw = Connection::open(&db).unwrap();
    let _tx = raw
        .transaction_with_behavior(rusqlite::TransactionBehavior::Exclusive)
        .unwrap();
    let a = attachment("c1", "eth0");
    // A held lock is worth retrying (the plugin reports "try again later"), not a failure.
    let msg = match store.claim(&[claim("10.0.0.1", "p", Some(&a), &pod("ns", "p", "u"), T0)]) {
        Err(StoreError::Unavailable { message, .. }) => message,
        other => panic!("expected Unavailable, got {other:?}"),
    };
    assert!(msg.contains(&db.display().to_string()), "{msg}");
    assert!(msg.contains("another process holds the lock"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// The file.

#[test]
fn schema_version_and_layout_are_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claims.db");
    let store = SqliteStore::open(&db).unwrap();
    let a = attachment("c1", "eth0");
    store
        .claim(&[claim(
            "2001:db8::7",
            "v6",
            Some(&a),
            &pod("ns", "web", "u1"),
            T0,
        )])
        .unwrap();
    drop(store);

    // What an operator sees with sqlite3.
    let raw = Connection::open(&db).unwrap();
    let pragma = |name: &str| -> i64 {
        raw.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(pragma("user_version"), i64::from(SCHEMA_VERSION));
    assert_eq!(pragma("application_id"), i64::from(APPLICATION_ID));
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal", "WAL is recorded in the file");
    let columns: Vec<(String, String, bool)> = raw
        .prepare("SELECT name, type, \"notnull\" FROM pragma_table_info('claims') ORDER BY cid")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let columns: Vec<(&str, &str, bool)> = columns
        .iter()
        .map(|(n, t, nn)| (n.as_str(), t.as_str(), *nn))
        .collect();
    assert_eq!(
        columns,
        [
            ("address", "TEXT", true),
            ("family", "INTEGER", true),
            ("pool", "TEXT", true),
            ("container_id", "TEXT", false),
            ("interface", "TEXT", false),
            ("pod_namespace", "TEXT", true),
            ("pod_name", "TEXT", true),
            ("pod_uid", "TEXT", true),
            ("owner_kind", "TEXT", false),
            ("owner_name", "TEXT", false),
            ("updated_at", "INTEGER", true),
            ("network", "TEXT", true),
            ("node", "TEXT", true),
        ]
    );
    let indexes: Vec<String> = raw
        .prepare("SELECT group_concat(name) FROM (SELECT name FROM pragma_index_info(?1) ORDER BY seqno)")
        .and_then(|mut stmt| {
            ["claims_by_attachment", "claims_by_pod", "claims_by_network"]
                .iter()
                .map(|i| stmt.query_row([i], |r| r.get(0)))
                .collect()
        })
        .unwrap();
    assert_eq!(
        indexes,
        [
            "container_id,interface",
            "pod_namespace,pod_name",
            "network"
        ]
    );
    let row: (String, i64, String, Option<String>, Option<String>, String) = raw
        .query_row(
            "SELECT address, family, pool, container_id, interface, pod_name FROM claims",
            [],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            },
        )
        .unwrap();
    assert_eq!(
        row,
        (
            "2001:db8::7".into(),
            6,
            "v6".into(),
            Some("c1".into()),
            Some("eth0".into()),
            "web".into()
        )
    );
}

#[test]
fn missing_parent_directories_are_created_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("var/lib/allot/claims.db");
    SqliteStore::open(&db).unwrap();
    for d in ["var", "var/lib", "var/lib/allot"] {
        let mode = std::fs::metadata(dir.path().join(d))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700, "{d} has mode {mode:o}");
    }
    let mode = std::fs::metadata(&db).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the state file has mode {mode:o}");
}

#[test]
fn a_file_that_is_not_a_database_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claims.db");
    std::fs::write(&db, "pools:\n  - name: default\n".repeat(500)).unwrap();
    let msg = open_error(&db);
    assert!(msg.contains(&db.display().to_string()), "{msg}");
    assert!(msg.contains("not a SQLite database or is corrupt"), "{msg}");
}

#[test]
fn a_corrupt_database_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claims.db");
    {
        let store = SqliteStore::open(&db).unwrap();
        let a = attachment("c1", "eth0");
        let claims: Vec<Claim> = (0..200)
            .map(|i| {
                claim(
                    &format!("10.0.{}.{}", i / 256, i % 256),
                    "p",
                    Some(&a),
                    &pod("ns", "p", "u"),
                    T0,
                )
            })
            .collect();
        store.claim(&claims).unwrap();
    }
    // Keep the 100-byte header, scribble over the rest.
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() > 4096, "the database has more than one page");
    for (i, b) in bytes.iter_mut().enumerate().skip(100) {
        *b = (i * 7 % 251) as u8;
    }
    std::fs::write(&db, bytes).unwrap();

    let msg = match SqliteStore::open(&db) {
        Err(StoreError::Backend { message, .. }) => message,
        Err(other) => panic!("expected a backend error, got {other}"),
        Ok(store) => backend_error(store.all()),
    };
    assert!(msg.contains(&db.display().to_string()), "{msg}");
    assert!(
        msg.contains("corrupt") || msg.contains("malformed"),
        "{msg}"
    );
}

#[test]
fn a_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let msg = open_error(dir.path());
    assert!(msg.contains("is a directory"), "{msg}");
}

#[test]
fn a_parent_that_is_a_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("state"), b"").unwrap();
    let db = dir.path().join("state/claims.db");
    let msg = open_error(&db);
    assert!(msg.contains("cannot create the directory"), "{msg}");
    assert!(
        msg.contains(&dir.path().join("state").display().to_string()),
        "{msg}"
    );
}

#[test]
fn an_unreadable_file_is_a_clear_error() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claims.db");
    drop(SqliteStore::open(&db).unwrap());
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o000)).unwrap();
    if std::fs::File::open(&db).is_ok() {
        eprintln!("skipped: this process bypasses file permissions (root?)");
        return;
    }
    let msg = open_error(&db);
    assert!(msg.contains("permission denied"), "{msg}");
    assert!(msg.contains("--state"), "{msg}");
}

#[test]
fn another_applications_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("theirs.db");
    Connection::open(&theirs)
        .unwrap()
        .execute_batch(
            "CREATE TABLE things (id INTEGER PRIMARY KEY); INSERT INTO things VALUES (1);",
        )
        .unwrap();
    let msg = open_error(&theirs);
    assert!(
        msg.contains("not an allot state file") && msg.contains("things"),
        "{msg}"
    );

    let tagged = dir.path().join("tagged.db");
    Connection::open(&tagged)
        .unwrap()
        .execute_batch("PRAGMA application_id = 42;")
        .unwrap();
    let msg = open_error(&tagged);
    assert!(msg.contains("another application"), "{msg}");

    // Nothing was written into either.
    let count: i64 = Connection::open(&theirs)
        .unwrap()
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, 1);
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claims.db");
    drop(SqliteStore::open(&db).unwrap());
    Connection::open(&db)
        .unwrap()
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    let msg = open_error(&db);
    assert!(msg.contains("newer than this allot understands"), "{msg}");
}

/// Hand-edited rows that do not decode are errors naming the row, never panics, and a write that
/// would return such a row writes nothing.
#[test]
fn bad_rows_are_errors_naming_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("claims.db");
    let store = SqliteStore::open(&db).unwrap();
    let raw = Connection::open(&db).unwrap();
    raw.execute_batch("PRAGMA ignore_check_constraints = ON")
        .unwrap();
    let text = |s: &str| rusqlite::types::Value::Text(s.into());
    let t0 = T0 as i64;
    // (address, family, pool, updated_at, what the error says)
    let cases = [
        ("10.0.0.300", 4, text("p"), t0, "not an IP address"),
        ("2001:DB8::1", 6, text("p"), t0, "not in canonical form"),
        ("10.0.0.1", 6, text("p"), t0, "family is 6"),
        (
            "10.0.0.2",
            4,
            rusqlite::types::Value::Blob(vec![0xff, 0]),
            t0,
            "column pool",
        ),
        ("10.0.0.3", 4, text("p"), -5, "negative"),
    ];
    for (address, family, pool, updated_at, why) in cases {
        raw.execute(
            "INSERT INTO claims VALUES (?1, ?2, ?3, 'bad', 'eth0', 'ns', 'p', 'u', NULL, NULL, ?4, 'net', 'node-a')",
            rusqlite::params![address, family, pool, updated_at],
        )
        .unwrap();
        let msg = backend_error(store.all());
        assert!(
            msg.contains(&format!("{address:?}")) && msg.contains(why),
            "{address}: {msg}"
        );
        let msg = backend_error(store.claims_of(&attachment("bad", "eth0")));
        assert!(msg.contains(why), "{address}: {msg}");
        let msg = backend_error(store.release_attachment(&attachment("bad", "eth0")));
        assert!(msg.contains(why), "{address}: {msg}");
        let count: i64 = raw
            .query_row("SELECT count(*) FROM claims", [], |r| r.get(0))
            .unwrap();
        assert_eq!(count, 1, "{address}: the failed release rolled back");
        raw.execute("DELETE FROM claims", []).unwrap();
    }
    assert_eq!(store.all().unwrap(), vec![]);
}
