//! A container's environment and command line, as the kubelet makes them ("Define dependent
//! environment variables", "Expose pod information through environment variables"): the
//! image's environment, then the `kubernetes` Service's variables, `envFrom`, `env` (each
//! `$(VAR)` expanded from the variables defined before it; `$$` is a literal `$`), with
//! `fieldRef`, `resourceFieldRef`, `configMapKeyRef` and `secretKeyRef` values; `command` and
//! `args` expanded the same way.

use std::collections::BTreeMap;
use std::net::IpAddr;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Container, Pod};

use super::volumes::ObjectCache;

/// What field references resolve against besides the pod.
#[derive(Debug, Clone, Copy)]
pub struct FieldContext<'a> {
    pub node_name: &'a str,
    pub host_ips: &'a [IpAddr],
    pub pod_ips: &'a [IpAddr],
}

fn join_ips(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `key="value"` lines in key order, as the downward API formats a map.
fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.map(|m| {
        m.iter()
            .map(|(k, v)| format!("{k}={}", serde_json::to_string(v).expect("a string")))
            .collect::<Vec<_>>()
            .join("\n")
    })
    .unwrap_or_default()
}

/// The value of a `fieldRef`.
pub fn field_value(ctx: &FieldContext<'_>, pod: &Pod, path: &str) -> Result<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let subscript = |prefix: &str| -> Option<String> {
        path.strip_prefix(prefix)?
            .strip_suffix("']")
            .map(str::to_string)
    };
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(meta.labels.as_ref()),
        "metadata.annotations" => format_map(meta.annotations.as_ref()),
        "spec.nodeName" => ctx.node_name.to_string(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        "status.hostIP" => ctx
            .host_ips
            .first()
            .map(ToString::to_string)
            .unwrap_or_default(),
        "status.hostIPs" => join_ips(ctx.host_ips),
        "status.podIP" => ctx
            .pod_ips
            .first()
            .map(ToString::to_string)
            .unwrap_or_default(),
        "status.podIPs" => join_ips(ctx.pod_ips),
        _ => {
            if let Some(key) = subscript("metadata.labels['") {
                meta.labels
                    .as_ref()
                    .and_then(|l| l.get(&key).cloned())
                    .unwrap_or_default()
            } else if let Some(key) = subscript("metadata.annotations['") {
                meta.annotations
                    .as_ref()
                    .and_then(|a| a.get(&key).cloned())
                    .unwrap_or_default()
            } else {
                bail!("fieldRef {path:?} is not supported");
            }
        }
    })
}

/// A quantity as a number of base units ("100m" → 0.1, "128Mi" → 134217728).
pub fn parse_quantity(q: &str) -> Result<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let n: f64 = number.parse().with_context(|| format!("quantity {q:?}"))?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0f64.powi(2),
        "Gi" => 1024.0f64.powi(3),
        "Ti" => 1024.0f64.powi(4),
        "Pi" => 1024.0f64.powi(5),
        "Ei" => 1024.0f64.powi(6),
        _ => bail!("quantity {q:?}: unknown suffix {suffix:?}"),
    };
    Ok(n * factor)
}

/// The value of a `resourceFieldRef` (divisor 1): a limit falls back to the node's
/// allocatable amount (8 CPUs, 32 GiB), a request to 0, as the downward API documents.
pub fn resource_value(pod: &Pod, container: Option<&str>, resource: &str) -> Result<String> {
    let spec = pod.spec.as_ref().context("a pod without spec")?;
    let c = match container {
        Some(name) => spec.containers.iter().find(|c| c.name == name),
        None => spec.containers.first(),
    }
    .context("resourceFieldRef: no such container")?;
    let (kind, name) = resource
        .split_once('.')
        .with_context(|| format!("resourceFieldRef {resource:?}"))?;
    let res = c.resources.as_ref();
    let list = match kind {
        "limits" => res.and_then(|r| r.limits.as_ref()),
        "requests" => res.and_then(|r| r.requests.as_ref()),
        _ => bail!("resourceFieldRef {resource:?}"),
    };
    let value = match list.and_then(|l| l.get(name)) {
        Some(q) => parse_quantity(&q.0)?,
        None if kind == "limits" => match name {
            "cpu" => 8.0,
            "memory" => 32.0 * 1024.0f64.powi(3),
            _ => 100.0 * 1024.0f64.powi(3),
        },
        None => 0.0,
    };
    // CPU rounds up to whole cores, everything else to whole units.
    Ok(format!("{}", value.ceil() as u64))
}

/// Expands `$(VAR)` references from `vars`; unknown ones stay as written, `$$` is `$`.
pub fn expand(input: &str, vars: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match vars(name) {
                Some(v) => out.push_str(&v),
                None => out.push_str(&format!("$({name})")),
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// What a container's environment is made from besides its spec.
pub struct EnvContext<'a> {
    pub fields: FieldContext<'a>,
    pub objects: &'a ObjectCache,
    /// Where the API server is (the `kubernetes` Service's variables).
    pub api_host: &'a str,
    pub api_port: u16,
    pub hostname: &'a str,
}

/// A container's environment, in order (a later entry overrides an earlier one of the same
/// name), and its command line expanded. `image_env` are `KEY=value` entries.
pub async fn resolve(
    ctx: &EnvContext<'_>,
    pod: &Pod,
    container: &Container,
    image_env: &[String],
) -> Result<(Vec<(String, String)>, BTreeMap<String, String>)> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut env: Vec<(String, String)> = image_env
        .iter()
        .filter_map(|e| e.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.push(("HOSTNAME".into(), ctx.hostname.to_string()));
    // What the kubelet knows (and expands from): everything but the image's environment.
    let mut known: BTreeMap<String, String> = BTreeMap::new();
    // No kube-proxy runs, so the kubernetes Service's ClusterIP leads nowhere: the variables
    // name the API server's own address, which is what in-cluster clients dial.
    let (host, port) = (ctx.api_host, ctx.api_port.to_string());
    for (k, v) in [
        ("KUBERNETES_SERVICE_HOST", host.to_string()),
        ("KUBERNETES_SERVICE_PORT", port.clone()),
        ("KUBERNETES_SERVICE_PORT_HTTPS", port.clone()),
        ("KUBERNETES_PORT", format!("tcp://{host}:{port}")),
        ("KUBERNETES_PORT_443_TCP", format!("tcp://{host}:{port}")),
        ("KUBERNETES_PORT_443_TCP_PROTO", "tcp".to_string()),
        ("KUBERNETES_PORT_443_TCP_PORT", port.clone()),
        ("KUBERNETES_PORT_443_TCP_ADDR", host.to_string()),
    ] {
        known.insert(k.into(), v);
    }
    let mut ordered: Vec<(String, String)> = known.clone().into_iter().collect();
    for from in container.env_from.as_deref().unwrap_or_default() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (secret, name, optional) = if let Some(cm) = &from.config_map_ref {
            (false, cm.name.clone(), cm.optional)
        } else if let Some(s) = &from.secret_ref {
            (true, s.name.clone(), s.optional)
        } else {
            continue;
        };
        match ctx.objects.data(secret, ns, &name).await? {
            Some(data) => {
                for (k, v) in data {
                    let key = format!("{prefix}{k}");
                    let value = String::from_utf8_lossy(&v).into_owned();
                    known.insert(key.clone(), value.clone());
                    ordered.push((key, value));
                }
            }
            None if optional == Some(true) => {}
            None => bail!(
                "{} {name:?} not found (envFrom)",
                if secret { "secret" } else { "configmap" }
            ),
        }
    }
    for var in container.env.as_deref().unwrap_or_default() {
        let value = if let Some(source) = &var.value_from {
            if let Some(f) = &source.field_ref {
                field_value(&ctx.fields, pod, &f.field_path)?
            } else if let Some(r) = &source.resource_field_ref {
                let c = r.container_name.as_deref().unwrap_or(&container.name);
                resource_value(pod, Some(c), &r.resource)?
            } else if let Some(k) = &source.config_map_key_ref {
                match key_of(ctx, false, ns, &k.name, &k.key).await? {
                    Some(v) => v,
                    None if k.optional == Some(true) => continue,
                    None => bail!(
                        "configmap {:?}: no key {:?} (env {})",
                        k.name,
                        k.key,
                        var.name
                    ),
                }
            } else if let Some(k) = &source.secret_key_ref {
                match key_of(ctx, true, ns, &k.name, &k.key).await? {
                    Some(v) => v,
                    None if k.optional == Some(true) => continue,
                    None => bail!("secret {:?}: no key {:?} (env {})", k.name, k.key, var.name),
                }
            } else {
                bail!("env {}: valueFrom without a supported source", var.name);
            }
        } else {
            let known_now = known.clone();
            expand(var.value.as_deref().unwrap_or_default(), &|n| {
                known_now.get(n).cloned()
            })
        };
        known.insert(var.name.clone(), value.clone());
        ordered.push((var.name.clone(), value));
    }
    env.extend(ordered);
    Ok((dedup(env), known))
}

async fn key_of(
    ctx: &EnvContext<'_>,
    secret: bool,
    ns: &str,
    name: &str,
    key: &str,
) -> Result<Option<String>> {
    Ok(ctx
        .objects
        .data(secret, ns, name)
        .await?
        .and_then(|d| d.get(key).map(|v| String::from_utf8_lossy(v).into_owned())))
}

/// Keeps each name once, at its first position, with its last value.
fn dedup(env: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in env {
        match out.iter_mut().find(|(name, _)| *name == k) {
            Some(slot) => slot.1 = v,
            None => out.push((k, v)),
        }
    }
    out
}

/// The command line: `command` (else the image's entrypoint) and `args` (else, when neither
/// is given, the image's cmd), as the kubelet and the runtime combine them, expanded.
pub fn command_line(
    container: &Container,
    entrypoint: &[String],
    cmd: &[String],
    vars: &BTreeMap<String, String>,
) -> Vec<String> {
    let command = container.command.clone().unwrap_or_default();
    let args = container.args.clone().unwrap_or_default();
    let (command, args) = match (command.is_empty(), args.is_empty()) {
        (false, _) => (command, args),
        (true, false) => (entrypoint.to_vec(), args),
        (true, true) => (entrypoint.to_vec(), cmd.to_vec()),
    };
    command
        .into_iter()
        .chain(args)
        .map(|a| expand(&a, &|n| vars.get(n).cloned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_follows_the_kubelet_rules() {
        let vars = |n: &str| (n == "NODE").then(|| "node-1".to_string());
        assert_eq!(expand("--node=$(NODE)", &vars), "--node=node-1");
        assert_eq!(expand("$(MISSING)/x", &vars), "$(MISSING)/x");
        assert_eq!(expand("$$(NODE) costs $5", &vars), "$(NODE) costs $5");
        assert_eq!(expand("$(NODE", &vars), "$(NODE");
    }

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        assert_eq!(parse_quantity("100m").unwrap(), 0.1);
        assert_eq!(parse_quantity("2").unwrap(), 2.0);
        assert_eq!(parse_quantity("128Mi").unwrap(), 134217728.0);
        assert_eq!(parse_quantity("1G").unwrap(), 1e9);
        assert!(parse_quantity("1Zi").is_err());
    }

    #[test]
    fn command_and_args_combine_with_the_image() {
        let mut c = Container {
            name: "c".into(),
            ..Default::default()
        };
        let ep = vec!["/usr/local/bin/allotctl".to_string()];
        let cmd = vec!["--help".to_string()];
        let vars = BTreeMap::from([("NS".to_string(), "kube-system".to_string())]);
        assert_eq!(
            command_line(&c, &ep, &cmd, &vars),
            ["/usr/local/bin/allotctl", "--help"]
        );
        c.args = Some(vec!["claims".into(), "--namespace=$(NS)".into()]);
        assert_eq!(
            command_line(&c, &ep, &cmd, &vars),
            [
                "/usr/local/bin/allotctl",
                "claims",
                "--namespace=kube-system"
            ]
        );
        c.command = Some(vec!["/bin/true".into()]);
        assert_eq!(
            command_line(&c, &ep, &cmd, &vars),
            ["/bin/true", "claims", "--namespace=kube-system"]
        );
    }
}
