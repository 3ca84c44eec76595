//! The lab's certificates and kubeconfigs, made in process with rcgen: a CA, the API server's
//! serving certificate, one client certificate per user, and the service-account signing key.
//!
//! User names and groups are the ones Kubernetes' bootstrap RBAC policy and Node authorizer
//! expect, so the real authorizers apply to each component ("Authenticating", client
//! certificates: the common name is the user, organizations are groups).

use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use serde_json::json;

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The lab's certificate authority, kept in memory to sign more certificates (nodes added
/// later) and written to `dir`.
pub struct Pki {
    dir: PathBuf,
    ca_params: CertificateParams,
    ca_key: KeyPair,
    pub ca_cert: PathBuf,
}

impl Pki {
    /// A new CA in `dir` (created).
    pub fn create(dir: &Path) -> Result<Pki> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.distinguished_name = dn("allot-lab-ca", &[]);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = ca_params.self_signed(&ca_key)?;
        let ca_cert = dir.join("ca.crt");
        write(&ca_cert, &ca.pem(), 0o644)?;
        write(&dir.join("ca.key"), &ca_key.serialize_pem(), 0o600)?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca_params,
            ca_key,
            ca_cert,
        })
    }

    /// A serving certificate for `names` (IP addresses and DNS names), written as `<file>.crt`
    /// and `<file>.key`.
    pub fn serving(&self, file: &str, common_name: &str, names: &[String]) -> Result<CertFiles> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse::<IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => Ok(SanType::DnsName(n.clone().try_into()?)),
            })
            .collect::<Result<_>>()?;
        params.distinguished_name = dn(common_name, &[]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.sign(file, params)
    }

    /// A client certificate for user `user` in `groups`, written as `<file>.crt`/`.key`.
    pub fn client(&self, file: &str, user: &str, groups: &[&str]) -> Result<CertFiles> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = dn(user, groups);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.sign(file, params)
    }

    fn sign(&self, file: &str, params: CertificateParams) -> Result<CertFiles> {
        let key = KeyPair::generate()?;
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = params.signed_by(&key, &issuer)?;
        let files = CertFiles {
            cert: self.dir.join(format!("{file}.crt")),
            key: self.dir.join(format!("{file}.key")),
        };
        write(&files.cert, &cert.pem(), 0o644)?;
        write(&files.key, &key.serialize_pem(), 0o600)?;
        Ok(files)
    }

    /// The service-account token signing key pair: (private key, public key) files.
    pub fn service_account_keys(&self) -> Result<(PathBuf, PathBuf)> {
        let key = KeyPair::generate()?;
        let private = self.dir.join("sa.key");
        let public = self.dir.join("sa.pub");
        write(&private, &key.serialize_pem(), 0o600)?;
        write(&public, &key.public_key_pem(), 0o644)?;
        Ok((private, public))
    }
}

/// The user of the admin kubeconfig, in `system:masters`.
pub const ADMIN_USER: &str = "allot-lab-admin";

/// Everything a control plane authenticates with: the CA, the API server's serving
/// certificate, the service-account key pair, the front proxy's client certificate, and
/// kubeconfigs for the admin and for the controller-manager and scheduler (as the users
/// upstream's bootstrap RBAC names).
pub struct ControlPlaneCerts {
    pub pki: Pki,
    pub ca_key: PathBuf,
    pub serving: CertFiles,
    pub sa_private: PathBuf,
    pub sa_public: PathBuf,
    pub front_proxy: CertFiles,
    /// The API server's client certificate for kubelets (logs, exec, port-forward): group
    /// `system:masters`, which a kubelet's webhook authorization lets through, as kubeadm's
    /// `apiserver-kubelet-client` did.
    pub kubelet_client: CertFiles,
    pub admin_kubeconfig: PathBuf,
    pub controller_manager_kubeconfig: PathBuf,
    pub scheduler_kubeconfig: PathBuf,
    clients: [(CertFiles, &'static str); 3],
}

impl ControlPlaneCerts {
    /// Makes them in `pki_dir` and `kubeconfigs` (created), for an API server at `server`
    /// whose certificate names `names` besides the `kubernetes` Service's DNS names,
    /// `localhost`, `127.0.0.1` and `::1`.
    pub fn create(
        pki_dir: &Path,
        kubeconfigs: &Path,
        server: &str,
        names: &[String],
    ) -> Result<ControlPlaneCerts> {
        fs::create_dir_all(kubeconfigs)
            .with_context(|| format!("creating {}", kubeconfigs.display()))?;
        let pki = Pki::create(pki_dir)?;
        let mut all: Vec<String> = names.to_vec();
        for n in [
            "127.0.0.1",
            "::1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "localhost",
        ] {
            if !all.iter().any(|a| a == n) {
                all.push(n.into());
            }
        }
        let serving = pki.serving("apiserver", "kube-apiserver", &all)?;
        const CM: &str = "system:kube-controller-manager";
        const SCHEDULER: &str = "system:kube-scheduler";
        let clients = [
            (
                pki.client("admin", ADMIN_USER, &["system:masters"])?,
                ADMIN_USER,
            ),
            (pki.client("kube-controller-manager", CM, &[])?, CM),
            (pki.client("kube-scheduler", SCHEDULER, &[])?, SCHEDULER),
        ];
        let (sa_private, sa_public) = pki.service_account_keys()?;
        let front_proxy = pki.client("front-proxy-client", "front-proxy-client", &[])?;
        let kubelet_client = pki.client(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
        )?;
        let certs = ControlPlaneCerts {
            ca_key: pki_dir.join("ca.key"),
            pki,
            serving,
            sa_private,
            sa_public,
            front_proxy,
            kubelet_client,
            admin_kubeconfig: kubeconfigs.join("admin.kubeconfig"),
            controller_manager_kubeconfig: kubeconfigs.join("kube-controller-manager.kubeconfig"),
            scheduler_kubeconfig: kubeconfigs.join("kube-scheduler.kubeconfig"),
            clients,
        };
        certs.write_kubeconfigs(server)?;
        Ok(certs)
    }

    /// (Re)writes the admin's, controller-manager's and scheduler's kubeconfigs for an API
    /// server at `server`.
    pub fn write_kubeconfigs(&self, server: &str) -> Result<()> {
        let paths = [
            &self.admin_kubeconfig,
            &self.controller_manager_kubeconfig,
            &self.scheduler_kubeconfig,
        ];
        for (path, (cert, user)) in paths.into_iter().zip(&self.clients) {
            write_kubeconfig(path, server, &self.pki.ca_cert, cert, user)?;
        }
        Ok(())
    }
}

fn dn(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    // rcgen keeps one value per attribute type; Kubernetes reads every O of the subject, and
    // the lab's users have at most one group.
    if let Some(o) = organizations.first() {
        dn.push(DnType::OrganizationName, *o);
    }
    dn
}

fn write(path: &Path, text: &str, mode: u32) -> Result<()> {
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Writes a kubeconfig for `server` authenticating with `client`, trusting `ca`.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    client: &CertFiles,
    user: &str,
) -> Result<()> {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "allot-lab", "cluster": {
            "server": server,
            "certificate-authority": ca,
        }}],
        "users": [{"name": user, "user": {
            "client-certificate": client.cert,
            "client-key": client.key,
        }}],
        "contexts": [{"name": "allot-lab", "context": {"cluster": "allot-lab", "user": user}}],
        "current-context": "allot-lab",
    });
    write(path, &serde_yaml::to_string(&config)?, 0o600)
}
