//! `allotctl cni install`: what the chart's init container runs on each node. It copies the
//! `allot` plugin into the runtime's plugin directory and installs network configuration, each
//! checked first with the plugin's own parser (so a bad value fails the init container with the
//! reason, rather than every pod's ADD later), each written atomically (a temporary file in the
//! same directory, fsynced, renamed over the old one: the runtime never sees half a file, and a
//! plugin being executed keeps running the old binary).

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use allot_cni::config;
use anyhow::{Context as _, bail};
use serde_json::{Map, Value};

#[derive(clap::Subcommand)]
pub enum CniCommand {
    /// Install the plugin and network configuration on this node (the chart's init container).
    Install(InstallArgs),
}

#[derive(clap::Args)]
pub struct InstallArgs {
    /// The plugin binary to install (default: `allot` beside allotctl).
    #[arg(long, value_name = "FILE")]
    plugin: Option<PathBuf>,
    /// The directory the container runtime runs CNI plugins from.
    #[arg(long, value_name = "DIR", default_value = "/opt/cni/bin")]
    bin_dir: PathBuf,
    /// An ipam section (`{"type": "allot", …}`) to check and install at --ipam-dest, for
    /// network configurations to copy from.
    #[arg(long, value_name = "FILE", requires = "ipam_dest")]
    ipam: Option<PathBuf>,
    #[arg(long, value_name = "FILE", requires = "ipam")]
    ipam_dest: Option<PathBuf>,
    /// A network configuration list (`.conflist`) with allot as the IPAM of a plugin, to check
    /// and install at --network-dest (in the runtime's configuration directory).
    #[arg(long, value_name = "FILE", requires = "network_dest")]
    network: Option<PathBuf>,
    #[arg(long, value_name = "FILE", requires = "network")]
    network_dest: Option<PathBuf>,
}

pub fn command(c: CniCommand) -> anyhow::Result<ExitCode> {
    match c {
        CniCommand::Install(args) => install(&args),
    }
}

fn install(args: &InstallArgs) -> anyhow::Result<ExitCode> {
    // Everything is checked before anything is written.
    let plugin = match &args.plugin {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("cannot find allotctl's own path; pass --plugin")?
            .with_file_name("allot"),
    };
    let binary = std::fs::read(&plugin)
        .with_context(|| format!("reading the plugin {}", plugin.display()))?;
    let ipam = match (&args.ipam, &args.ipam_dest) {
        (Some(src), Some(dest)) => Some((check_ipam_file(src)?, dest)),
        _ => None,
    };
    let network = match (&args.network, &args.network_dest) {
        (Some(src), Some(dest)) => Some((check_network_file(src)?, dest)),
        _ => None,
    };

    let installed = args.bin_dir.join("allot");
    for dest in [
        Some(&installed),
        args.ipam_dest.as_ref(),
        args.network_dest.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        refuse_unless_file(dest)?;
    }
    write_atomically(&installed, &binary, 0o755)?;
    println!("installed {}", installed.display());
    for (text, dest) in ipam.iter().chain(network.iter()) {
        write_atomically(dest, text.as_bytes(), 0o644)?;
        println!("installed {}", dest.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn read_json(path: &Path) -> anyhow::Result<(String, Map<String, Value>)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => Ok((text, map)),
        Ok(_) => bail!("{}: not a JSON object", path.display()),
        Err(e) => bail!("{}: not JSON: {e}", path.display()),
    }
}

/// An ipam section, checked as the plugin checks it in a network config.
pub fn check_ipam_file(path: &Path) -> anyhow::Result<String> {
    let (text, section) = read_json(path)?;
    check_ipam(&Value::Object(section)).with_context(|| path.display().to_string())?;
    Ok(text)
}

fn check_ipam(section: &Value) -> anyhow::Result<()> {
    if section.get("type").and_then(Value::as_str).is_none() {
        bail!("the ipam section has no \"type\" (expected \"type\": \"allot\")");
    }
    let conf = Map::from_iter([("ipam".to_string(), section.clone())]);
    let parsed = config::ipam(&conf).map_err(|e| anyhow::anyhow!("{}", e.msg))?;
    parsed
        .reject_unknown()
        .map_err(|e| anyhow::anyhow!("{}", e.msg))?;
    Ok(())
}

/// A `.conflist`: a CNI version allot speaks, a name, plugins each with a type, and at least one
/// whose ipam is allot's (checked as the plugin checks it).
pub fn check_network_file(path: &Path) -> anyhow::Result<String> {
    let (text, conf) = read_json(path)?;
    let at = || path.display().to_string();
    config::cni_version(&conf)
        .map_err(|e| anyhow::anyhow!("{}", e.msg))
        .with_context(at)?;
    config::network_name(&conf)
        .map_err(|e| anyhow::anyhow!("{}", e.msg))
        .with_context(at)?;
    let plugins = match conf.get("plugins") {
        Some(Value::Array(p)) if !p.is_empty() => p,
        _ => bail!(
            "{}: a network configuration list needs a non-empty \"plugins\" list",
            at()
        ),
    };
    let mut allot = 0;
    for (i, plugin) in plugins.iter().enumerate() {
        if plugin.get("type").and_then(Value::as_str).is_none() {
            bail!("{}: plugins[{i}] has no \"type\"", at());
        }
        if let Some(ipam) = plugin.get("ipam")
            && ipam.get("type").and_then(Value::as_str) == Some("allot")
        {
            check_ipam(ipam).with_context(|| format!("{}: plugins[{i}].ipam", at()))?;
            allot += 1;
        }
    }
    if allot == 0 {
        bail!(
            "{}: no plugin has \"ipam\": {{\"type\": \"allot\", …}}",
            at()
        );
    }
    Ok(text)
}

/// A `dest` that exists and is not a regular file (a directory, a symlink) is not ours to replace.
fn refuse_unless_file(dest: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(dest) {
        Ok(meta) if !meta.file_type().is_file() => bail!(
            "{} exists and is not a regular file: refusing to replace it",
            dest.display()
        ),
        _ => Ok(()),
    }
}

/// Writes `bytes` to a temporary file beside `dest` (its directory made if missing), fsyncs it,
/// sets `mode` and renames it over `dest`. Refuses a `dest` that exists and is not a regular file (a directory, a symlink).
fn write_atomically(dest: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let dir = dest
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    refuse_unless_file(dest)?;
    let name = dest
        .file_name()
        .with_context(|| format!("{}: not a file name", dest.display()))?;
    let tmp = dir.join(format!(
        ".{}.allot-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        std::fs::rename(&tmp, dest)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", dest.display()));
    }
    Ok(())
}
