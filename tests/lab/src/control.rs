//! The control socket (`DIR/control.sock`): one command per connection, one line each way
//! before the reply's last line, `ok` or `error: <message>`.
//!
//! ```text
//! restart etcd|kube-apiserver|kube-controller-manager|kube-scheduler
//! restart-daemon NAME containerd|kubelet
//!                    a real node's daemon stopped (SIGTERM) and started again; the containers
//!                    go on running
//! stop-node NAME     a lost node, as when its power is cut: SIGKILL its kubelet, containerd,
//!                    every shim and container (or its stand-in and containers); no CNI DEL, no
//!                    status update, nothing of the node answers any more
//! start-node NAME    start it again: a real node boots afresh (its /run and its pods' network
//!                    namespaces are gone: the kubelet makes every sandbox anew)
//! add-node           one more node; replies with its name
//! status             cluster.json, refreshed
//! ```

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::cluster::{self, Shared};
use crate::controlplane::Component;
use crate::realnode::Daemon;

/// A command of the control socket.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Restart(Component),
    RestartDaemon(String, Daemon),
    StopNode(String),
    StartNode(String),
    AddNode,
    Status,
}

impl Command {
    pub fn parse(words: &[&str]) -> Result<Command> {
        Ok(match words {
            ["restart", c] => Command::Restart(c.parse()?),
            ["restart-daemon", n, d] => Command::RestartDaemon(n.to_string(), d.parse()?),
            ["stop-node", n] => Command::StopNode(n.to_string()),
            ["start-node", n] => Command::StartNode(n.to_string()),
            ["add-node"] => Command::AddNode,
            ["status"] => Command::Status,
            _ => bail!(
                "unknown command {:?}: restart COMPONENT | restart-daemon NAME DAEMON | \
                 stop-node NAME | start-node NAME | add-node | status",
                words.join(" ")
            ),
        })
    }

    pub fn line(&self) -> String {
        match self {
            Command::Restart(c) => format!("restart {c}"),
            Command::RestartDaemon(n, d) => format!("restart-daemon {n} {d}"),
            Command::StopNode(n) => format!("stop-node {n}"),
            Command::StartNode(n) => format!("start-node {n}"),
            Command::AddNode => "add-node".into(),
            Command::Status => "status".into(),
        }
    }
}

/// Runs `command` on the cluster in `shared`; returns the reply's text.
pub(crate) async fn execute(
    shared: &Shared,
    ops: &tokio::sync::Mutex<()>,
    command: &Command,
) -> Result<String> {
    // One operation at a time: a restart and a node start must not interleave.
    let _serial = ops.lock().await;
    let ready_timeout = cluster::lock(shared).options.ready_timeout;
    let reply = match command {
        Command::Restart(component) => {
            let from = jiff::Timestamp::now();
            cluster::stop_component(shared, *component).await?;
            cluster::start_component(shared, *component).await?;
            if *component == Component::KubeApiserver {
                // Until it is ready, a restarted API server refuses requests RBAC would allow
                // (its authorizer has not read the roles yet): a test that counts refusals
                // must know when that was.
                let logs = cluster::lock(shared).info.dir.join("logs");
                let until = jiff::Timestamp::now();
                crate::audit::note_restart(&logs, crate::audit::Restart { from, until })?;
            }
            format!("{component} restarted")
        }
        Command::RestartDaemon(name, daemon) => {
            let mut st = cluster::lock(shared);
            let node = st
                .nodes
                .iter_mut()
                .find(|n| n.info.name == *name)
                .with_context(|| format!("no node {name}"))?;
            node.proc.restart(*daemon)?;
            format!("{name}: {daemon} restarted")
        }
        Command::StopNode(name) => {
            let mut st = cluster::lock(shared);
            let node = st
                .nodes
                .iter_mut()
                .find(|n| n.info.name == *name)
                .with_context(|| format!("no node {name}"))?;
            let root = node.info.root.clone();
            let killed = node.proc.power_off(&root);
            format!("{name}: lost, {killed} process(es) killed")
        }
        Command::StartNode(name) => {
            {
                let mut st = cluster::lock(shared);
                let node = st
                    .nodes
                    .iter_mut()
                    .find(|n| n.info.name == *name)
                    .with_context(|| format!("no node {name}"))?;
                if node.proc.running() {
                    bail!("{name}: it runs already");
                }
                node.proc.power_on()?;
            }
            let client = client_of(shared).await?;
            cluster::wait_nodes_ready(shared, &client, std::slice::from_ref(name), ready_timeout)
                .await?;
            format!("{name}: Ready")
        }
        Command::AddNode => {
            let name = cluster::launch_node(shared)?;
            let client = client_of(shared).await?;
            cluster::wait_nodes_ready(shared, &client, std::slice::from_ref(&name), ready_timeout)
                .await?;
            name
        }
        Command::Status => String::new(),
    };
    let info = cluster::write_info(shared)?;
    Ok(match command {
        Command::Status => serde_json::to_string_pretty(&info)?,
        _ => reply,
    })
}

async fn client_of(shared: &Shared) -> Result<kube::Client> {
    let kubeconfig = cluster::lock(shared).info.kubeconfig.clone();
    crate::kube_client(&kubeconfig).await
}

/// Serves the control socket at `path` until the task is aborted.
pub(crate) async fn serve(
    path: &Path,
    shared: Shared,
    ops: std::sync::Arc<tokio::sync::Mutex<()>>,
) -> Result<tokio::task::JoinHandle<()>> {
    let _ = std::fs::remove_file(path);
    let listener =
        UnixListener::bind(path).with_context(|| format!("listening on {}", path.display()))?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let shared = shared.clone();
            let ops = ops.clone();
            tokio::spawn(async move {
                if let Err(e) = handle(stream, &shared, &ops).await {
                    tracing::warn!("control socket: {e:#}");
                }
            });
        }
    }))
}

async fn handle(stream: UnixStream, shared: &Shared, ops: &tokio::sync::Mutex<()>) -> Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let reply = match Command::parse(&words) {
        Ok(command) => {
            tracing::info!("control: {}", command.line());
            execute(shared, ops, &command).await
        }
        Err(e) => Err(e),
    };
    let text = match reply {
        Ok(text) if text.is_empty() => "ok\n".to_string(),
        Ok(text) => format!("{text}\nok\n"),
        Err(e) => format!("error: {e:#}\n"),
    };
    write.write_all(text.as_bytes()).await?;
    write.shutdown().await?;
    Ok(())
}

/// Sends `command` to the lab whose control socket is `path`; returns the reply's text
/// (without the final `ok`), or the lab's error.
pub async fn send(path: &Path, command: &Command, timeout: Duration) -> Result<String> {
    let mut stream = UnixStream::connect(path).await.with_context(|| {
        format!(
            "connecting to {}: is the lab cluster running (allot-lab-cluster up)?",
            path.display()
        )
    })?;
    stream
        .write_all(format!("{}\n", command.line()).as_bytes())
        .await?;
    let mut reply = String::new();
    tokio::time::timeout(timeout, async {
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        while reader.read_line(&mut line).await? > 0 {
            reply.push_str(&line);
            line.clear();
        }
        anyhow::Ok(())
    })
    .await
    .with_context(|| format!("{}: no reply within {timeout:?}", command.line()))??;
    let reply = reply.trim_end();
    if let Some(error) = reply.lines().last().and_then(|l| l.strip_prefix("error: ")) {
        bail!("{}: {error}", command.line());
    }
    match reply.strip_suffix("ok") {
        Some(text) => Ok(text.trim_end().to_string()),
        None => bail!("{}: the lab's reply ended early: {reply}", command.line()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_read_back_as_written() {
        for line in [
            "restart etcd",
            "restart kube-apiserver",
            "restart-daemon node-1 containerd",
            "restart-daemon node-1 kubelet",
            "stop-node node-2",
            "start-node node-2",
            "add-node",
            "status",
        ] {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(Command::parse(&words).unwrap().line(), line);
        }
        let err = Command::parse(&["restart", "kubelet"]).unwrap_err();
        assert!(format!("{err:#}").contains("one of etcd"), "{err:#}");
    }
}
