//! `allot-lab-cluster up`: a local Kubernetes cluster (the upstream control plane, and nodes
//! running upstream containerd and the kubelet), until SIGINT/SIGTERM. `allot-lab-cluster ctl
//! DIR COMMAND`: control a running one.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use allot_lab::{ClusterOptions, Command, LabCluster, NodeKind};
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "allot's local Kubernetes lab")]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a cluster and keep it up until SIGINT/SIGTERM; prints `KUBECONFIG=<path>` once
    /// it is ready.
    Up {
        /// Nodes (network namespaces, each with containerd and a kubelet).
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Nodes run by allot's kubelet stand-in instead of containerd and a kubelet: for more
        /// nodes than real ones fit in this machine's memory.
        #[arg(long)]
        stand_in: bool,
        /// The lab's directory (certificates, etcd data, logs, the nodes' files).
        #[arg(long, default_value_os_t = allot_lab::paths::workspace_root().join("target/lab"))]
        dir: PathBuf,
        /// Keep the directory after teardown.
        #[arg(long)]
        keep: bool,
        /// Do not offer allot's image (localhost/allot:dev) to the nodes (push it to the lab's
        /// registry): for a cluster without allot's binaries built.
        #[arg(long)]
        no_allot_image: bool,
        /// One more image stand-in nodes run as real processes: REFERENCE=DIRECTORY (a
        /// directory holding config.json and rootfs/, see the README). Repeatable.
        #[arg(long = "image", value_name = "REF=DIR")]
        images: Vec<String>,
        /// kube-controller-manager's --node-monitor-grace-period, in seconds.
        #[arg(long, default_value_t = 50)]
        node_monitor_grace_seconds: u64,
        /// Wait this long for another lab on this machine to end instead of failing.
        #[arg(long, default_value_t = 0)]
        wait_seconds: u64,
    },
    /// Send a command to a running lab: restart COMPONENT | restart-daemon NODE DAEMON |
    /// stop-node NAME | start-node NAME | add-node | status.
    Ctl {
        /// The lab's directory (holding control.sock).
        dir: PathBuf,
        #[arg(required = true, num_args = 1..)]
        command: Vec<String>,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn,kube_client=off".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let args = Args::parse();
    // Worker threads live as long as the runtime: the children they start get SIGKILL when the
    // launcher dies (PR_SET_PDEATHSIG follows the spawning thread).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    match args.command {
        Cmd::Up {
            nodes,
            stand_in,
            dir,
            keep,
            no_allot_image,
            images,
            node_monitor_grace_seconds,
            wait_seconds,
        } => {
            let mut options = ClusterOptions::new(dir);
            options.nodes = nodes;
            options.node_kind = if stand_in {
                NodeKind::StandIn
            } else {
                NodeKind::Real
            };
            options.keep = keep;
            options.allot_image = !no_allot_image;
            for image in images {
                let (reference, dir) = image
                    .split_once('=')
                    .with_context(|| format!("--image {image:?}: expected REFERENCE=DIRECTORY"))?;
                options
                    .images
                    .push((reference.to_string(), std::fs::canonicalize(dir)?));
            }
            options.node_monitor_grace = Duration::from_secs(node_monitor_grace_seconds);
            options.lock_wait = Duration::from_secs(wait_seconds);
            let started = Instant::now();
            let mut terminate =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            let lab = tokio::select! {
                lab = LabCluster::start(options) => lab?,
                _ = tokio::signal::ctrl_c() => return Ok(()),
                _ = terminate.recv() => return Ok(()),
            };
            let info = lab.info();
            tracing::info!(
                "ready in {:.1?}; control: allot-lab-cluster ctl {} status",
                started.elapsed(),
                info.dir.display()
            );
            println!("KUBECONFIG={}", info.kubeconfig.display());
            std::io::stdout().flush()?;
            if !stand_in && !no_allot_image {
                // The newcomer's next steps (the README's "Try it on a local control plane").
                eprintln!(
                    "\nIn a second terminal, from the repository:\n  \
                     export KUBECONFIG={} PATH=$PWD/target/tools:$PATH\n  \
                     helm install allot charts/allot -n allot-system --create-namespace \\\n    \
                     -f charts/allot/ci/local-cluster-values.yaml --wait\n  \
                     kubectl apply -f target/tools/multus-daemonset.yml   # Multus, for more NICs\n",
                    info.kubeconfig.display()
                );
            }
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
            tracing::info!("tearing down");
            drop(lab);
            Ok(())
        }
        Cmd::Ctl { dir, command } => {
            let words: Vec<&str> = command.iter().map(String::as_str).collect();
            let command = Command::parse(&words)?;
            let reply = allot_lab::control::send(
                &dir.join("control.sock"),
                &command,
                Duration::from_secs(300),
            )
            .await?;
            if !reply.is_empty() {
                println!("{reply}");
            }
            Ok(())
        }
    }
}
