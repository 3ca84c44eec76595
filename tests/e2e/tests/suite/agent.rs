//! The agent process itself: bad command lines and files, a second agent on the same socket.
//! A mistake never panics, never destroys a file it does not own, and never cuts off a running
//! agent from its plugin.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use allot_e2e::*;

fn agent(pools: &Path, socket: &Path, state: &Path) -> Command {
    let mut cmd = Command::new(bin("allot-agent"));
    cmd.arg("--standalone")
        .arg(pools)
        .arg("--socket")
        .arg(socket)
        .arg("--state")
        .arg(state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Waits up to `limit` for the child to exit by itself; kills it after that. Returns its output
/// and whether it exited by itself.
fn finish(mut child: Child, limit: Duration) -> (Output, bool) {
    let deadline = Instant::now() + limit;
    let mut exited = true;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            // SAFETY: kill(2) on the pid of a child we have not reaped yet.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            exited = false;
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("panicked"), "allot-agent panicked:\n{text}");
    (out, exited)
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout)
}

#[test]
fn a_missing_pools_directory_is_a_clear_startup_error() {
    if skip("a_missing_pools_directory_is_a_clear_startup_error") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir");
    let child = agent(
        &missing,
        &dir.path().join("a.sock"),
        &dir.path().join("s.db"),
    )
    .spawn()
    .unwrap();
    let (out, exited) = finish(child, Duration::from_secs(10));
    assert!(
        exited && !out.status.success(),
        "started anyway:\n{}",
        text(&out)
    );
    assert!(text(&out).contains("no-such-dir"), "{}", text(&out));
}

#[test]
fn a_corrupt_state_file_stops_the_agent_and_is_left_untouched() {
    if skip("a_corrupt_state_file_stops_the_agent_and_is_left_untouched") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("pools")).unwrap();
    let state = dir.path().join("allot.db");
    let garbage: Vec<u8> = (0..8192u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(&state, &garbage).unwrap();
    let child = agent(
        &dir.path().join("pools"),
        &dir.path().join("a.sock"),
        &state,
    )
    .spawn()
    .unwrap();
    let (out, exited) = finish(child, Duration::from_secs(10));
    assert!(
        exited && !out.status.success(),
        "started on a corrupt store:\n{}",
        text(&out)
    );
    assert!(
        text(&out).contains("allot.db"),
        "the error does not name the file:\n{}",
        text(&out)
    );
    assert_eq!(
        fs::read(&state).unwrap(),
        garbage,
        "the corrupt state file was modified"
    );
}

#[test]
fn the_socket_option_never_deletes_a_regular_file() {
    if skip("the_socket_option_never_deletes_a_regular_file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("pools")).unwrap();
    let precious = dir.path().join("precious.txt");
    fs::write(&precious, "not a socket\n").unwrap();
    let child = agent(
        &dir.path().join("pools"),
        &precious,
        &dir.path().join("s.db"),
    )
    .spawn()
    .unwrap();
    let (out, _) = finish(child, Duration::from_secs(3));
    assert_eq!(
        fs::read_to_string(&precious).ok().as_deref(),
        Some("not a socket\n"),
        "allot-agent --socket {} replaced a regular file; output:\n{}",
        precious.display(),
        text(&out)
    );
}

#[test]
fn a_second_agent_on_the_same_socket_does_not_cut_off_the_first() {
    let Some(lab) = Lab::new("a_second_agent_on_the_same_socket", "") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let child = agent(
        &lab.agent.pools_dir(),
        &lab.agent.socket(),
        &dir.path().join("other.db"),
    )
    .spawn()
    .unwrap();
    let (out, _) = finish(child, Duration::from_secs(3));
    let readyz = lab.agent.get(allot_api::READYZ);
    assert!(
        matches!(readyz, Ok((200, _))),
        "after a second agent was started on its socket and stopped, the running agent is \
         unreachable ({readyz:?}); second agent's output:\n{}",
        text(&out)
    );
}

/// The socket is mode 0600, so other users cannot even connect; should it be opened up, the
/// agent still refuses any peer whose uid differs from its own (SO_PEERCRED).
#[test]
fn a_peer_of_another_user_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    if allot_e2e::skip("a_peer_of_another_user_is_refused") {
        return;
    }
    let agent = allot_e2e::Agent::start(&allot_e2e::ippool("peer", "10.99.0.0/24", None, &[]));
    let socket = agent.socket();
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket is private");
    // Open the socket and its directory to everyone: only the uid check stands.
    std::fs::set_permissions(
        socket.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let config = serde_json::json!({
        "cniVersion": "1.1.0", "name": "peer", "type": "allot",
        "ipam": {"type": "allot", "socket": socket}
    })
    .to_string();
    // A copy of the plugin that `nobody` can run wherever the checkout lives.
    let public = tempfile::tempdir().unwrap();
    std::fs::set_permissions(public.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let plugin = public.path().join("allot");
    std::fs::copy(allot_e2e::bin("allot"), &plugin).unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let status = |as_nobody: bool| {
        let mut cmd = if as_nobody {
            let mut c = std::process::Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(&plugin);
            c
        } else {
            std::process::Command::new(allot_e2e::bin("allot"))
        };
        let mut child = cmd
            .env("CNI_COMMAND", "STATUS")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("running allot");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(config.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let refused = status(true);
    let out = String::from_utf8_lossy(&refused.stdout);
    assert!(!refused.status.success(), "nobody must be refused: {out}");
    assert!(
        out.contains("\"code\": 50") || out.contains("\"code\":50"),
        "{out}"
    );
    assert!(
        agent.log().contains("refused a peer of another user"),
        "{}",
        agent.log()
    );
    let served = status(false);
    assert!(
        served.status.success(),
        "root is served: {}",
        String::from_utf8_lossy(&served.stdout)
    );
}
