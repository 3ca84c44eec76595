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
