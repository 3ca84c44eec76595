//! The webhook's certificates: a CA of its own and the serving certificate it signs, as kept in
//! one Secret, and when each is renewed. No cert-manager: the controller makes, renews and
//! publishes them itself, so an upgrade can never leave the API server trusting a CA that no
//! longer signs what the webhook serves (Spiderpool #3352, #4243).
//!
//! The Secret (type `kubernetes.io/tls`) holds
//! - `tls.crt`, `tls.key`: the serving certificate, for the Service's DNS names, and its key;
//! - `ca.crt`, `ca.key`: the CA that signed it;
//! - `next-ca.crt`, `next-ca.key`: during a CA rotation, the CA that takes over next;
//! - `ca-bundle.crt`: every CA the webhook configurations must trust (their `caBundle`).
//!
//! Renewal ([`renew`]): the serving certificate when a third of its validity is left, or at once
//! when it no longer matches its CA, its key or the Service's names. The CA in two steps, so
//! that the API server trusts whatever a replica serves at every moment: a next CA first joins
//! the bundle (the leader writes it into the webhook configurations); once the configurations
//! carry it and `ca_overlap` has passed, it signs a new serving certificate and becomes the CA.
//! The old CA stays in the bundle until it expires, for replicas still serving what it signed.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_k8s::openapi::ByteString;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData,
};
use x509_parser::certificate::X509Certificate;

pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const NEXT_CA_CERT: &str = "next-ca.crt";
pub const NEXT_CA_KEY: &str = "next-ca.key";
pub const CA_BUNDLE: &str = "ca-bundle.crt";

/// Every certificate's notBefore is this much in the past (seconds): for API server nodes whose
/// clocks are behind this one's.
pub const SKEW: i64 = 300;

/// How long certificates live and how long a next CA is trusted before it signs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertPolicy {
    pub ca_validity: Duration,
    pub serving_validity: Duration,
    /// A next CA signs only this long after it joined the bundle (and once the webhook
    /// configurations carry it), so every API server has picked the new bundle up.
    pub ca_overlap: Duration,
}

impl Default for CertPolicy {
    /// A CA of five years (its successor joins the bundle with 20 months left), serving
    /// certificates of 90 days renewed after 60: renewal is a routine event exercised several
    /// times a year, not a once-a-decade surprise, and a controller that was down for a month
    /// still starts with a valid certificate.
    fn default() -> Self {
        CertPolicy {
            ca_validity: Duration::from_secs(5 * 365 * 86_400),
            serving_validity: Duration::from_secs(90 * 86_400),
            ca_overlap: Duration::from_secs(600),
        }
    }
}

/// The PEM texts kept in the Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Material {
    pub tls_cert: String,
    pub tls_key: String,
    pub ca_cert: String,
    pub ca_key: String,
    /// The next CA's certificate and key, during a CA rotation.
    pub next_ca: Option<(String, String)>,
    /// The CAs to trust, concatenated.
    pub bundle: String,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a private key into a log.
        f.debug_struct("Material")
            .field("tls_cert", &self.tls_cert)
            .field("ca_cert", &self.ca_cert)
            .field("next_ca", &self.next_ca.as_ref().map(|(c, _)| c))
            .field("bundle", &self.bundle)
            .finish_non_exhaustive()
    }
}

impl Material {
    /// The Secret's `data`.
    pub fn to_data(&self) -> BTreeMap<String, ByteString> {
        let mut data = BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            data.insert(k.to_string(), ByteString(v.as_bytes().to_vec()));
        };
        put(TLS_CERT, &self.tls_cert);
        put(TLS_KEY, &self.tls_key);
        put(CA_CERT, &self.ca_cert);
        put(CA_KEY, &self.ca_key);
        put(CA_BUNDLE, &self.bundle);
        if let Some((cert, key)) = &self.next_ca {
            put(NEXT_CA_CERT, cert);
            put(NEXT_CA_KEY, key);
        }
        data
    }

    /// Reads a Secret's `data`; says which key is missing or not text.
    pub fn from_data(data: &BTreeMap<String, ByteString>) -> Result<Material, MaterialError> {
        let text = |k: &'static str| -> Result<Option<String>, MaterialError> {
            data.get(k)
                .map(|v| String::from_utf8(v.0.clone()).map_err(|_| MaterialError::NotText(k)))
                .transpose()
        };
        let required = |k: &'static str| text(k)?.ok_or(MaterialError::Missing(k));
        let next_ca = match (text(NEXT_CA_CERT)?, text(NEXT_CA_KEY)?) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err(MaterialError::HalfANextCa),
        };
        Ok(Material {
            tls_cert: required(TLS_CERT)?,
            tls_key: required(TLS_KEY)?,
            ca_cert: required(CA_CERT)?,
            ca_key: required(CA_KEY)?,
            next_ca,
            bundle: required(CA_BUNDLE)?,
        })
    }

    /// When the serving certificate expires (Unix seconds), if it parses.
    pub fn serving_not_after(&self) -> Option<i64> {
        let der = cert_der(&self.tls_cert, TLS_CERT).ok()?;
        with_cert(&der, TLS_CERT, |c| c.validity().not_after.timestamp()).ok()
    }
}

/// Why a Secret's data holds no material at all (as opposed to material that is there but
/// unusable: expired, for other names, from another CA, which [`renew`] judges).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MaterialError {
    /// There is no Secret yet.
    #[error("no certificate yet")]
    NoSecret,
    /// A key is absent: the Secret is new, or was emptied by hand.
    #[error("{0} is missing")]
    Missing(&'static str),
    /// A key holds bytes that are not text, so not PEM.
    #[error("{0} is not PEM text")]
    NotText(&'static str),
    /// One of the next CA's certificate and key without the other.
    #[error("{NEXT_CA_CERT} and {NEXT_CA_KEY} come together")]
    HalfANextCa,
}

/// New material to write, and why.
#[derive(Clone, Debug)]
pub struct Renewal {
    pub material: Material,
    pub reason: String,
}

/// What to write instead of `current` (or of nothing, `Err` saying why there is nothing usable)
/// at `now` (Unix seconds), if anything. Every replica may create and repair (it needs a usable
/// certificate to serve); only the one that `rotate`s renews ahead of time (the leader, so
/// replicas do not race), and a next CA takes over only when `promote` says the webhook
/// configurations already trust it.
pub fn renew(
    current: Result<&Material, &MaterialError>,
    names: &[String],
    policy: &CertPolicy,
    now: i64,
    rotate: bool,
    promote: bool,
) -> Result<Option<Renewal>, rcgen::Error> {
    let fresh = |reason: String| {
        fresh(names, policy, now).map(|material| Some(Renewal { material, reason }))
    };
    let m = match current {
        Err(why) => return fresh(why.to_string()),
        Ok(m) => m,
    };
    let seen = match inspect(m, names) {
        Err(why) => return fresh(format!("the stored certificates are unusable: {why}")),
        Ok(seen) => seen,
    };
    let renewal = |material: Material, reason: String| Ok(Some(Renewal { material, reason }));
    if now >= seen.ca.not_after {
        return match &m.next_ca {
            Some(next) => renewal(
                promoted(next, &seen, names, policy, now)?,
                "the CA expired; its successor takes over".into(),
            ),
            None => fresh("the CA expired".into()),
        };
    }
    if let Some(problem) = &seen.serving_problem {
        // Keeping the names it had: during a rollout that renames the Service, replicas of
        // both versions accept the certificate instead of reissuing it for each other.
        let mut both = names.to_vec();
        both.extend(
            seen.serving_names
                .iter()
                .filter(|n| !names.contains(n))
                .cloned(),
        );
        return renewal(reissued(m, &seen, &both, policy, now)?, problem.clone());
    }
    if now >= seen.serving.not_after {
        return renewal(
            reissued(m, &seen, names, policy, now)?,
            "the serving certificate expired".into(),
        );
    }
    if !rotate {
        return Ok(None);
    }
    match (&m.next_ca, &seen.next) {
        (None, _) if seen.ca.left(now) < seen.ca.life() / 3 => {
            let (cert, key) = new_ca(policy, now)?;
            let mut next = m.clone();
            next.next_ca = Some((cert, key));
            next.bundle = bundle(&next, &seen, now);
            return renewal(
                next,
                "the CA has a third of its validity left: its successor joins the CA bundle".into(),
            );
        }
        (Some(next), Some(next_seen))
            if promote
                && now >= next_seen.not_before + SKEW + policy.ca_overlap.as_secs() as i64 =>
        {
            return renewal(
                promoted(next, &seen, names, policy, now)?,
                "the next CA is trusted by the webhook configurations: it takes over".into(),
            );
        }
        _ => {}
    }
    if seen.serving.left(now) < seen.serving.life() / 3 {
        return renewal(
            reissued(m, &seen, names, policy, now)?,
            "the serving certificate has a third of its validity left".into(),
        );
    }
    let tidy = bundle(m, &seen, now);
    if tidy != m.bundle {
        let mut next = m.clone();
        next.bundle = tidy;
        return renewal(
            next,
            "the CA bundle lists an expired CA or misses a current one".into(),
        );
    }
    Ok(None)
}

/// When [`renew`] next has something to do (Unix seconds): for the replica that `rotate`s, a
/// serving certificate or a CA reaching two thirds of its life, a next CA due to take over, an
/// old CA of the bundle expiring; for the others, only an expiry. `None` when the material is
/// not usable (renew at once).
pub fn next_renewal(m: &Material, policy: &CertPolicy, rotate: bool) -> Option<i64> {
    let seen = inspect(m, &[]).ok()?;
    let mut due = vec![seen.serving.not_after, seen.ca.not_after];
    if rotate {
        due.push(seen.serving.not_after - seen.serving.life() / 3);
        match seen.next {
            Some(next) => due.push(next.not_before + SKEW + policy.ca_overlap.as_secs() as i64),
            None => due.push(seen.ca.not_after - seen.ca.life() / 3),
        }
        due.extend(seen.bundle.iter().map(|(_, not_after)| *not_after));
    }
    due.into_iter().min()
}

/// The DNS names a Service is reached by from the API server (it uses `NAME.NAMESPACE.svc`).
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.to_string(),
    ]
}

#[derive(Clone, Copy, Debug)]
struct Validity {
    not_before: i64,
    not_after: i64,
}

impl Validity {
    fn life(&self) -> i64 {
        self.not_after - self.not_before - SKEW
    }

    fn left(&self, now: i64) -> i64 {
        self.not_after - now
    }
}

/// What the stored certificates say.
struct Seen {
    ca: Validity,
    next: Option<Validity>,
    serving: Validity,
    /// Why the serving certificate cannot be served as it is.
    serving_problem: Option<String>,
    /// The names the serving certificate is valid for.
    serving_names: Vec<String>,
    /// The bundle's certificates (PEM) and when each expires.
    bundle: Vec<(String, i64)>,
}

fn inspect(m: &Material, names: &[String]) -> Result<Seen, String> {
    let ca_der = cert_der(&m.ca_cert, CA_CERT)?;
    let ca = with_cert(&ca_der, CA_CERT, |ca| -> Result<Validity, String> {
        key_matches(&m.ca_key, ca, CA_KEY)?;
        if !ca.is_ca() {
            return Err(format!("{CA_CERT} is not a CA certificate"));
        }
        Ok(validity(ca))
    })??;
    let next = match &m.next_ca {
        Some((cert, key)) => {
            let der = cert_der(cert, NEXT_CA_CERT)?;
            Some(with_cert(&der, NEXT_CA_CERT, |c| {
                key_matches(key, c, NEXT_CA_KEY).map(|()| validity(c))
            })??)
        }
        None => None,
    };
    let mut bundle = Vec::new();
    for der in certificates(&m.bundle, CA_BUNDLE)? {
        let not_after = with_cert(&der, CA_BUNDLE, |c| c.validity().not_after.timestamp())?;
        bundle.push((to_pem(&der), not_after));
    }
    let serving = cert_der(&m.tls_cert, TLS_CERT).and_then(|der| {
        with_cert(&der, TLS_CERT, |cert| {
            let problem = with_cert(&ca_der, CA_CERT, |ca| serving_problem(m, cert, ca, names))
                .unwrap_or_else(Some);
            (validity(cert), problem, dns_names(cert))
        })
    });
    let (serving, serving_problem, serving_names) = match serving {
        Ok(v) => v,
        Err(why) => (
            Validity {
                not_before: 0,
                not_after: 0,
            },
            Some(why),
            Vec::new(),
        ),
    };
    Ok(Seen {
        ca,
        next,
        serving,
        serving_problem,
        serving_names,
        bundle,
    })
}

/// The DNS names a certificate is valid for.
fn dns_names(cert: &X509Certificate<'_>) -> Vec<String> {
    match cert.subject_alternative_name() {
        Ok(Some(san)) => san
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn serving_problem(
    m: &Material,
    cert: &X509Certificate<'_>,
    ca: &X509Certificate<'_>,
    names: &[String],
) -> Option<String> {
    if let Err(why) = key_matches(&m.tls_key, cert, TLS_KEY) {
        return Some(why);
    }
    if cert.verify_signature(Some(ca.public_key())).is_err() {
        return Some(format!("{TLS_CERT} is not signed by {CA_CERT}"));
    }
    let listed = dns_names(cert);
    let missing: Vec<&String> = names.iter().filter(|n| !listed.contains(n)).collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{TLS_CERT} is not valid for {} (the Service was renamed?)",
            missing
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// A new CA, a serving certificate it signs, and a bundle of that CA alone.
/// New material made at `now` (Unix seconds): a CA, and a serving certificate for `names`
/// signed by it; what [`renew`] writes when nothing usable is stored.
pub fn fresh(names: &[String], policy: &CertPolicy, now: i64) -> Result<Material, rcgen::Error> {
    let (ca_cert, ca_key) = new_ca(policy, now)?;
    let ca_not_after = now + policy.ca_validity.as_secs() as i64;
    let (tls_cert, tls_key) = new_serving(&ca_cert, &ca_key, ca_not_after, names, policy, now)?;
    Ok(Material {
        bundle: ca_cert.clone(),
        tls_cert,
        tls_key,
        ca_cert,
        ca_key,
        next_ca: None,
    })
}

/// `m` with a new serving certificate from its CA.
fn reissued(
    m: &Material,
    seen: &Seen,
    names: &[String],
    policy: &CertPolicy,
    now: i64,
) -> Result<Material, rcgen::Error> {
    let (tls_cert, tls_key) =
        new_serving(&m.ca_cert, &m.ca_key, seen.ca.not_after, names, policy, now)?;
    let mut next = m.clone();
    next.tls_cert = tls_cert;
    next.tls_key = tls_key;
    next.bundle = bundle(&next, seen, now);
    Ok(next)
}

/// The next CA as the CA, signing a new serving certificate.
fn promoted(
    (next_cert, next_key): &(String, String),
    seen: &Seen,
    names: &[String],
    policy: &CertPolicy,
    now: i64,
) -> Result<Material, rcgen::Error> {
    let not_after = seen.next.map_or(now, |v| v.not_after);
    let (tls_cert, tls_key) = new_serving(next_cert, next_key, not_after, names, policy, now)?;
    let mut next = Material {
        tls_cert,
        tls_key,
        ca_cert: next_cert.clone(),
        ca_key: next_key.clone(),
        next_ca: None,
        bundle: String::new(),
    };
    next.bundle = bundle(&next, seen, now);
    Ok(next)
}

/// The CAs to trust: those of the old bundle that have not expired (a replica may still serve
/// what they signed), then the CA and the next CA of `m`, each once.
fn bundle(m: &Material, seen: &Seen, now: i64) -> String {
    let mut pems: Vec<String> = Vec::new();
    let own = [Some(&m.ca_cert), m.next_ca.as_ref().map(|(c, _)| c)];
    let normal = |pem: &str| {
        cert_der(pem, CA_BUNDLE)
            .map(|der| to_pem(&der))
            .unwrap_or_else(|_| pem.to_string())
    };
    for (pem, not_after) in &seen.bundle {
        if *not_after > now && !pems.contains(pem) {
            pems.push(pem.clone());
        }
    }
    for pem in own.into_iter().flatten() {
        let pem = normal(pem);
        if !pems.contains(&pem) {
            pems.push(pem);
        }
    }
    pems.concat()
}

fn new_ca(policy: &CertPolicy, now: i64) -> Result<(String, String), rcgen::Error> {
    let mut params = CertificateParams::default();
    // A name of its own per CA, so the old and the new one are told apart in the bundle.
    params
        .distinguished_name
        .push(DnType::CommonName, format!("allot-webhook-ca-{now}"));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = at(now - SKEW)?;
    params.not_after = at(now + policy.ca_validity.as_secs() as i64)?;
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok((to_pem(cert.der()), key.serialize_pem()))
}

fn new_serving(
    ca_cert: &str,
    ca_key: &str,
    ca_not_after: i64,
    names: &[String],
    policy: &CertPolicy,
    now: i64,
) -> Result<(String, String), rcgen::Error> {
    let issuer = Issuer::from_ca_cert_pem(ca_cert, KeyPair::from_pem(ca_key)?)?;
    let mut params = CertificateParams::new(names.to_vec())?;
    params.distinguished_name.push(
        DnType::CommonName,
        names.first().cloned().unwrap_or_default(),
    );
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = at(now - SKEW)?;
    // Never past the CA: a certificate outliving its signer would not verify anyway.
    params.not_after = at((now + policy.serving_validity.as_secs() as i64).min(ca_not_after))?;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((to_pem(cert.der()), key.serialize_pem()))
}

fn at(unix: i64) -> Result<time::OffsetDateTime, rcgen::Error> {
    time::OffsetDateTime::from_unix_timestamp(unix).map_err(|_| rcgen::Error::Time)
}

fn to_pem(der: &[u8]) -> String {
    let block = pem::Pem::new("CERTIFICATE", der.to_vec());
    pem::encode_config(
        &block,
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

fn cert_der(text: &str, what: &str) -> Result<Vec<u8>, String> {
    match certificates(text, what)?.into_iter().next() {
        Some(der) => Ok(der),
        None => Err(format!("{what} holds no certificate")),
    }
}

/// The certificates of a PEM text, as DER.
fn certificates(text: &str, what: &str) -> Result<Vec<Vec<u8>>, String> {
    let blocks = pem::parse_many(text).map_err(|e| format!("{what} is not PEM: {e}"))?;
    blocks
        .into_iter()
        .map(|b| match b.tag() {
            "CERTIFICATE" => Ok(b.into_contents()),
            other => Err(format!("{what} holds a {other} block, not a CERTIFICATE")),
        })
        .collect()
}

fn with_cert<T>(
    der: &[u8],
    what: &str,
    f: impl FnOnce(&X509Certificate<'_>) -> T,
) -> Result<T, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("{what} is not an X.509 certificate: {e}"))?;
    Ok(f(&cert))
}

fn validity(cert: &X509Certificate<'_>) -> Validity {
    Validity {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    }
}

fn key_matches(key_pem: &str, cert: &X509Certificate<'_>, what: &str) -> Result<(), String> {
    let key =
        KeyPair::from_pem(key_pem).map_err(|e| format!("{what} is not a private key: {e}"))?;
    if key.subject_public_key_info() == cert.public_key().raw {
        Ok(())
    } else {
        Err(format!("{what} is not the key of its certificate"))
    }
}
