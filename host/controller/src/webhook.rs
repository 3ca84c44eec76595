//! Admission webhooks: every write of an IPPool, Subnet, ReservedIP, IPAMPool or IPAMAllocation
//! is checked by the same code the agent and the standalone loader run, before it is stored.
//!
//! - [`admit`](mod@admit): the checks (the validation Spiderpool's users know; `allot_core::edit` and
//!   the fleet module's checks) and the one mutation, `ipVersion` defaulted from the subnet.
//! - [`server`]: HTTPS on `--webhook-port`, served by every replica (the Service balances).
//! - [`certs`], [`secret`]: a CA and a serving certificate the controller makes itself, kept in
//!   one Secret shared by the replicas, renewed well before expiry (the CA with an overlap in the
//!   bundle), reloaded into the running server.
//! - [`configs`]: the ValidatingWebhookConfiguration and MutatingWebhookConfiguration, created
//!   and kept true (`caBundle` above all) by the leader.
//! - [`keeper`](mod@keeper): the loop that ties them together.
//!
//! Entry point: [`run`] (or [`Webhook::start`] and [`Webhook::stop`]).

pub mod admit;
pub mod certs;
pub mod configs;
mod keeper;
pub mod secret;
pub mod server;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use allot_core::store::Store;
use anyhow::Context;
use tokio::sync::watch;

pub use certs::CertPolicy;

use crate::lease::Leadership;

/// The webhook's flags.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct WebhookArgs {
    /// Port the admission webhooks are served on (HTTPS), by every replica.
    #[arg(
        long = "webhook-port",
        env = "ALLOT_WEBHOOK_PORT",
        default_value_t = 9443
    )]
    pub port: u16,
    /// Address to listen on. `::`, the default, answers IPv6 and IPv4 (where the node allows
    /// both; a node without IPv6 gets `0.0.0.0`): an IPv6-only cluster's API server reaches
    /// the webhook on the pod's IPv6 address.
    #[arg(
        long = "webhook-address",
        env = "ALLOT_WEBHOOK_ADDRESS",
        default_value = "::"
    )]
    pub address: IpAddr,
    /// The Service, in the controller's namespace, through which the API server reaches the
    /// webhooks (the certificate is made for its DNS names).
    #[arg(
        long = "webhook-service",
        env = "ALLOT_WEBHOOK_SERVICE",
        default_value = "allot-webhook"
    )]
    pub service: String,
    /// The port of that Service.
    #[arg(
        long = "webhook-service-port",
        env = "ALLOT_WEBHOOK_SERVICE_PORT",
        default_value_t = 443
    )]
    pub service_port: u16,
    /// The Secret, in the controller's namespace, that holds the webhook's CA and certificate
    /// (created and renewed by the controller).
    #[arg(
        long = "webhook-secret",
        env = "ALLOT_WEBHOOK_SECRET",
        default_value = "allot-webhook-tls"
    )]
    pub secret: String,
    /// Name of the ValidatingWebhookConfiguration and of the MutatingWebhookConfiguration the
    /// controller creates and keeps (do not ship them in a chart).
    #[arg(
        long = "webhook-config-name",
        env = "ALLOT_WEBHOOK_CONFIG_NAME",
        default_value = "allot"
    )]
    pub config_name: String,
    /// The ClusterRole that owns both configurations (the chart's `allot-controller`): deleting
    /// it, as `helm uninstall` does with or without its hooks, deletes them. Empty: no owner.
    #[arg(
        long = "webhook-owner",
        env = "ALLOT_WEBHOOK_OWNER",
        default_value = ""
    )]
    pub owner: String,
    /// Seconds between checks of the certificate and the configurations (they are also watched).
    #[arg(long = "webhook-check-seconds", env = "ALLOT_WEBHOOK_CHECK_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub check_seconds: u64,
}

impl WebhookArgs {
    /// What [`Webhook::start`] takes, for the controller's `namespace`.
    pub fn settings(&self, namespace: &str) -> Settings {
        Settings {
            bind: SocketAddr::new(self.address, self.port),
            namespace: namespace.to_string(),
            service: self.service.clone(),
            service_port: self.service_port,
            secret: self.secret.clone(),
            config_name: self.config_name.clone(),
            owner: Some(self.owner.clone()).filter(|o| !o.is_empty()),
            check_every: Duration::from_secs(self.check_seconds),
            certs: CertPolicy::default(),
        }
    }
}

/// Everything the webhook is configured with (the flags, and certificate lifetimes tests
/// shorten).
#[derive(Clone, Debug)]
pub struct Settings {
    pub bind: SocketAddr,
    pub namespace: String,
    pub service: String,
    pub service_port: u16,
    pub secret: String,
    pub config_name: String,
    /// The ClusterRole that owns the configurations, if any.
    pub owner: Option<String>,
    pub check_every: Duration,
    pub certs: CertPolicy,
}

impl Settings {
    pub fn target(&self) -> configs::Target {
        configs::Target {
            config_name: self.config_name.clone(),
            namespace: self.namespace.clone(),
            service: self.service.clone(),
            port: self.service_port,
            owner: self.owner.clone(),
        }
    }
}

/// A running webhook: the server and the keeper of its certificate and configurations.
pub struct Webhook {
    /// Where the server listens (the port chosen when the settings asked for port 0).
    pub local_addr: SocketAddr,
    certified: Arc<server::Certified>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Webhook {
    /// Binds the port (an error if it is taken), then serves and keeps the certificate and the
    /// configurations in the background. The server answers once the first certificate is in.
    pub async fn start(
        client: kube::Client,
        settings: Settings,
        store: Arc<dyn Store>,
        leadership: Leadership,
    ) -> anyhow::Result<Webhook> {
        let listener = allot_k8s::listen::bind(settings.bind)
            .and_then(tokio::net::TcpListener::from_std)
            .with_context(|| format!("webhook: listening on {} (--webhook-port)", settings.bind))?;
        let local_addr = listener.local_addr()?;
        let certified = Arc::new(server::Certified::default());
        let tls = server::tls_config(certified.clone()).context("webhook: TLS settings")?;
        let (stop, stopped) = watch::channel(false);
        let lookup = admit::Lookup::new(client.clone(), store);
        tracing::info!(address = %local_addr, "webhook: serving HTTPS");
        let keeper = keeper::Keeper {
            client,
            settings,
            certified: certified.clone(),
            leadership,
            confirmed: None,
        };
        let tasks = vec![
            tokio::spawn(server::serve(listener, tls, lookup, stopped.clone())),
            tokio::spawn(keeper.run(stopped)),
        ];
        Ok(Webhook {
            local_addr,
            certified,
            stop,
            tasks,
        })
    }

    /// Whether a certificate is loaded (the server completes handshakes).
    pub fn ready(&self) -> bool {
        self.certified.ready()
    }

    /// Stops accepting, lets requests in flight finish, stops the keeper.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Serves the webhooks until `shutdown` completes: the controller's entry point.
/// `certified` turns true once a certificate is served: until then a handshake fails, so the
/// replica must not be ready (the API server would be sent to it).
pub async fn run(
    client: kube::Client,
    args: &WebhookArgs,
    namespace: &str,
    store: Arc<dyn Store>,
    leadership: Leadership,
    certified: crate::serve::Readiness,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let webhook = Webhook::start(client, args.settings(namespace), store, leadership).await?;
    let mut shutdown = std::pin::pin!(shutdown);
    while !webhook.ready() {
        tokio::select! {
            _ = &mut shutdown => {
                webhook.stop().await;
                return Ok(());
            }
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    certified.set(true);
    shutdown.await;
    webhook.stop().await;
    Ok(())
}

/// Deletes the webhook configurations `args` names: for an uninstall (a Helm pre-delete hook),
/// so that none is left pointing at a Service that is gone.
pub async fn remove_configurations(client: kube::Client, args: &WebhookArgs) -> anyhow::Result<()> {
    configs::remove(&client, &args.config_name).await
}

/// Budget of one API request of the keeper.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs one API request within [`REQUEST_TIMEOUT`]; the API's answer, refusals included, is left
/// to the caller.
async fn request<T>(
    what: &str,
    verb: &str,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> anyhow::Result<Result<T, kube::Error>> {
    tokio::time::timeout(REQUEST_TIMEOUT, call)
        .await
        .map_err(|_| anyhow::anyhow!("{what}: {verb}: no answer within {REQUEST_TIMEOUT:?}"))
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// An API error with what to do about it.
fn api_error(what: &str, verb: &str, e: kube::Error) -> anyhow::Error {
    match e {
        kube::Error::Api(s) if s.code == 403 => anyhow::anyhow!(
            "{what}: {verb}: {}; the controller's ServiceAccount needs {verb} on it (see the webhook RBAC in docs/webhooks.md)",
            s.message
        ),
        other => anyhow::Error::new(other).context(format!("{what}: {verb}")),
    }
}
