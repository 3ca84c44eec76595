#!/usr/bin/env python3
"""The Helm chart (charts/allot), checked with real tools, offline (no API server can run here).

Rendering, with the real helm 4 scripts/setup.sh installs in target/tools:
 1. `helm lint --strict`, with the default values and with each charts/allot/ci/*-values.yaml;
    values.schema.json refuses misspelt keys and out-of-range values, with the reason.
 2. `helm template` (default values, each ci values file, the README's commands, as an install
    and as an upgrade): every built-in object passes Kubernetes' own schemas of 1.30 and of the
    newest version kubernetes-validate bundles, strictly (unknown fields refused); every
    allot.dev object (the default Policy, the pools) passes its CRD's schema; the Multus
    NetworkAttachmentDefinition and the ServiceMonitor have the shapes their CRDs require.
 3. RBAC: no wildcard; a comment before every rule in the templates; resourceNames wherever a
    verb touches one known object (Lease, Secret, webhook configurations, CRDs, the Policy),
    never on create (RBAC cannot narrow create by name: such a rule would deny).
 4. Every container runs the chart's image as the values say; every value of values.yaml lands
    where it should (ci/full-values.yaml sets every one to something else; a value no check
    covers fails the run).
 5. CRDs: charts/allot/crds equals crds/ and what this tree's `allotctl crds` writes; the CRD
    hook runs before install and upgrade, with the release's image, and may touch exactly them.
 6. The dashboard: a well-formed Grafana dashboard, in the ConfigMap as it is in the chart, and
    every metric and label it queries is in the /metrics of the real agent and controller run
    in step 7 (a renamed metric fails here).
 7. The rendered commands, run with this tree's binaries against the in-memory API server
    (scripts/chart_cluster.py): the CRD hook upgrades the CRDs of allot's first API, the
    controller and the agent start and serve, the init container installs the plugin, a first
    pod gets an address, the uninstall hook removes the webhook configurations, and every
    request each made is allowed by the chart's RBAC.
"""
import copy
import difflib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

import kubernetes_validate
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chart_cluster  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(ROOT, "charts", "allot")
HELM = os.path.join(ROOT, "target", "tools", "helm")
RELEASE = os.path.join(ROOT, "target", "release")
NS = "allot-system"
KUBE_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
FULL = os.path.join(CHART, "ci", "full-values.yaml")
MULTUS = os.path.join(CHART, "ci", "multus-values.yaml")

_spec = importlib.util.spec_from_file_location(
    "check_k8s_schemas", os.path.join(ROOT, "scripts", "check-k8s-schemas.py"))
crd_schemas = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(crd_schemas)

failures = []


def fail(message):
    failures.append(message)
    print(f"check-chart: FAIL: {message}", file=sys.stderr)


def say(message):
    print(f"check-chart: {message}")


def helm(*args, ok=True):
    # No cluster: `--dry-run=client` must not find one either.
    env = {**os.environ, "KUBECONFIG": os.devnull}
    out = subprocess.run([HELM, *args], capture_output=True, text=True, env=env)
    if ok and out.returncode:
        raise chart_cluster.Failure(f"helm {' '.join(args)}:\n{out.stderr}")
    return out


def render(*args, upgrade=False, name="allot", chart=CHART, namespace=NS):
    extra = ["--is-upgrade"] if upgrade else []
    out = helm("template", name, chart, "-n", namespace, *extra, *args)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def load_yaml(path):
    with open(path) as f:
        return yaml.safe_load(f)


# 1 -------------------------------------------------------------------------------------------
def check_lint():
    for values in [None, *sorted(p for p in os.listdir(os.path.join(CHART, "ci")))]:
        args = ["lint", "--strict", CHART] + (["-f", os.path.join(CHART, "ci", values)] if values else [])
        out = helm(*args, ok=False)
        if out.returncode:
            fail(f"helm lint with {values or 'the default values'}:\n{out.stdout}{out.stderr}")
    say("helm lint --strict passes with the default values and each ci/*-values.yaml")

    bad = [
        (["--set", "ipv4.subnt=10.0.0.0/24"], "additional properties 'subnt' not allowed"),
        (["--set", "policy.onFailure=maybe"], "onFailure"),
        (["--set", "agent.probe.tries=0"], "tries"),
        (["--set", "image.digest=latest"], "digest"),
        (["--set-json", 'policy.source={"file":"/x.wasm","oci":"oci://r/p:1"}'], "source"),
        (["--set", "network.conflist.fileName=../../evil"], "fileName"),
        (["--set", "controller.lease.renewDeadlineSeconds=20"],
         "renewDeadlineSeconds must be shorter than"),
        (["--set", "network.multus.enabled=true,network.conflist.enabled=true"], "choose one"),
    ]
    for args, reason in bad:
        out = helm("template", "allot", CHART, *args, ok=False)
        if out.returncode == 0 or reason not in out.stderr:
            fail(f"helm template {' '.join(args)} should fail naming {reason!r}: {out.stderr}")
    say(f"{len(bad)} bad values are refused with the reason")


# 2 -------------------------------------------------------------------------------------------
def check_schemas(docs, label):
    validators = crd_schemas.validators()
    builtin = allot = 0
    for d in docs:
        api, kind, name = d.get("apiVersion", ""), d.get("kind"), d["metadata"]["name"]
        if api.startswith("allot.dev/"):
            v = validators.get((api, kind))
            errors = crd_schemas.errors_of(v, d) if v else [f"no CRD for {api} {kind}"]
            for e in errors:
                fail(f"[{label}] {kind} {name}: {e}")
            allot += 1
        elif kind == "NetworkAttachmentDefinition":
            try:
                conf = json.loads(d["spec"]["config"])
                assert conf["name"] and conf["plugins"] and conf["cniVersion"]
                assert any(p.get("ipam", {}).get("type") == "allot" for p in conf["plugins"])
            except (KeyError, ValueError, AssertionError, TypeError) as e:
                fail(f"[{label}] NetworkAttachmentDefinition {name}: spec.config: {e!r}")
        elif kind == "ServiceMonitor":
            spec = d["spec"]
            if not spec.get("selector", {}).get("matchLabels") or not all(
                    e.get("port") for e in spec.get("endpoints", [])):
                fail(f"[{label}] ServiceMonitor {name}: selector and endpoints[].port needed")
        else:
            for version in KUBE_VERSIONS:
                try:
                    kubernetes_validate.validate(d, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    fail(f"[{label}] {kind} {name} against Kubernetes {version}: {e.message} "
                         f"at {'.'.join(map(str, e.path))}")
                except kubernetes_validate.SchemaNotFoundError:
                    fail(f"[{label}] {kind} {name}: no Kubernetes {version} schema for {api}")
            builtin += 1
    say(f"[{label}] {builtin} objects pass Kubernetes {' and '.join(KUBE_VERSIONS)} schemas "
        f"(strict), {allot} allot.dev objects their CRDs'")


# 3 -------------------------------------------------------------------------------------------
NAMED_ONLY = {"leases", "secrets", "validatingwebhookconfigurations",
              "mutatingwebhookconfigurations", "customresourcedefinitions", "policies",
              "policies/status"}


# Rules on those kinds that read many objects, not one known: fleet's kubeconfig Secrets (one
# per Cluster API cluster, in every namespace).
MANY_OBJECTS = {("allot-controller", ("secrets",))}


def check_rbac(docs, label):
    rules = 0
    for d in docs:
        if d["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in d.get("rules", []):
            rules += 1
            where = f"[{label}] {d['kind']} {d['metadata']['name']} rule {rule}"
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                if any("*" in str(v) for v in rule.get(field, [])):
                    fail(f"{where}: a wildcard in {field}")
            if rule.get("nonResourceURLs"):
                fail(f"{where}: nonResourceURLs")
            names = rule.get("resourceNames")
            if names and set(rule["verbs"]) & {"create", "deletecollection"}:
                fail(f"{where}: resourceNames cannot narrow create or deletecollection")
            touched = set(rule.get("resources", [])) & NAMED_ONLY
            many = (d["metadata"]["name"], tuple(rule["resources"])) in MANY_OBJECTS
            if touched and not names and set(rule["verbs"]) - {"create"} and not many:
                fail(f"{where}: {sorted(touched)} are touched by name only: resourceNames needed")
    crd_names = sorted(os.path.basename(p)[:-5] for p in os.listdir(os.path.join(CHART, "crds")))
    hook = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "allot-crds"]
    if hook and sorted(hook[0]["rules"][0]["resourceNames"]) != crd_names:
        fail(f"[{label}] the CRD hook may touch {hook[0]['rules'][0]['resourceNames']}, "
             f"the chart's CRDs are {crd_names}")
    say(f"[{label}] {rules} RBAC rules: no wildcard, resourceNames where one object is touched")


def check_rbac_comments():
    """Every rule in the RBAC templates comes after a comment that says why."""
    for path in sorted(os.listdir(os.path.join(CHART, "templates"))):
        text = open(os.path.join(CHART, "templates", path)).read().splitlines()
        for i, line in enumerate(text):
            if not re.match(r"^\s*- apiGroups:", line):
                continue
            j = i - 1
            while j >= 0 and text[j].strip().startswith("{{"):
                j -= 1
            if j < 0 or not text[j].strip().startswith("#"):
                fail(f"templates/{path}:{i + 1}: an RBAC rule without a comment saying why")
    say("every RBAC rule in the templates is preceded by a comment saying why")


# 4 -------------------------------------------------------------------------------------------
def pods(docs):
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet", "Job"):
            yield d, d["spec"]["template"]["spec"]


def containers(docs):
    for d, pod in pods(docs):
        for c in pod.get("initContainers", []) + pod["containers"]:
            yield d, c


def check_images(docs, image, policy, secrets, label):
    seen = 0
    for d, c in containers(docs):
        seen += 1
        where = f"[{label}] {d['kind']} {d['metadata']['name']} container {c['name']}"
        if c["image"] != image:
            fail(f"{where}: image {c['image']}, expected {image}")
        if c.get("imagePullPolicy") != policy:
            fail(f"{where}: imagePullPolicy {c.get('imagePullPolicy')}, expected {policy}")
    for d, pod in pods(docs):
        if pod.get("imagePullSecrets", []) != secrets:
            fail(f"[{label}] {d['kind']} {d['metadata']['name']}: imagePullSecrets "
                 f"{pod.get('imagePullSecrets')}")
    if seen < 5:
        fail(f"[{label}] only {seen} containers rendered")


def find(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found[0] if found else None


def container(docs, kind, name, init=False):
    pod = find(docs, kind, name)["spec"]["template"]["spec"]
    return (pod["initContainers"] if init else pod["containers"])[0]


def pod_spec(docs, kind, name):
    return find(docs, kind, name)["spec"]["template"]["spec"]


def env(c):
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def rule_resources(docs, role):
    return {r for rule in find(docs, "ClusterRole", role)["rules"] for r in rule["resources"]}


def cni_data(docs):
    return find(docs, "ConfigMap", "allot-cni")["data"]


def leaves(tree, prefix=""):
    if isinstance(tree, dict) and tree:
        for k, v in tree.items():
            yield from leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], tree


def helm_merge(base, override):
    """Values as Helm merges a values file over values.yaml: maps merge, null removes a key,
    anything else replaces."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = helm_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def lookup(tree, path):
    for key in path.split("."):
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def check_values():
    """Each value of values.yaml, set by ci/full-values.yaml (or by --set where the full values
    must keep the default), is checked where it lands."""
    F = render("-f", FULL)
    D = render()
    M = render("-f", MULTUS)
    defaults = load_yaml(os.path.join(CHART, "values.yaml"))
    full = helm_merge(defaults, load_yaml(FULL))
    agent, ctrl = container(F, "DaemonSet", "allot-agent"), container(F, "Deployment", "allot-controller")
    init = container(F, "DaemonSet", "allot-agent", init=True)
    apod, cpod = pod_spec(F, "DaemonSet", "allot-agent"), pod_spec(F, "Deployment", "allot-controller")
    v4, v6 = find(F, "IPPool", "underlay-v4")["spec"], find(F, "IPPool", "underlay-v6")["spec"]
    policy = find(F, "Policy", "cluster")["spec"]
    conflist = json.loads(cni_data(F)["05-storage.conflist"])
    ipam = json.loads(cni_data(F)["ipam.json"])
    nad = find(M, "NetworkAttachmentDefinition")
    volumes = {v["name"]: v.get("hostPath", {}).get("path") for v in apod["volumes"]}
    aenv, cenv = env(agent), env(ctrl)
    caps = agent["securityContext"]["capabilities"]
    image = "registry.example.com/net/allot@" + full["image"]["digest"]

    def has(c, *flags):
        return all(f in c["args"] for f in flags)

    def without(*sets):
        return render("--set", ",".join(sets))

    checks = {
        "image.repository": lambda: all(c["image"] == image for _, c in containers(F)),
        "image.digest": lambda: all(c["image"] == image for _, c in containers(F)),
        "image.tag": lambda: all(c["image"].endswith(":9.9.9")
                                 for _, c in containers(without("image.tag=9.9.9"))),
        "image.pullPolicy": lambda: all(c["imagePullPolicy"] == "Always" for _, c in containers(F)),
        "imagePullSecrets": lambda: all(p.get("imagePullSecrets") == [{"name": "registry-credentials"}]
                                        for _, p in pods(F)),
        "logLevel": lambda: env(container(F, "Job", "allot-crds"))["RUST_LOG"] == "debug"
        and env(container(D, "DaemonSet", "allot-agent"))["RUST_LOG"] == "info",
        "crds.upgrade": lambda: find(F, "Job", "allot-crds") is not None
        and find(without("crds.upgrade=false"), "Job", "allot-crds") is None,
        "policy.create": lambda: find(without("policy.create=false"), "Policy") is None,
        "policy.name": lambda: has(agent, "--policy-object=cluster")
        and any(r.get("resourceNames") == ["cluster"] for r in find(F, "ClusterRole", "allot-agent")["rules"]),
        "policy.source": lambda: find(D, "Policy")["spec"]["source"]
        == {"file": "/usr/lib/allot/policies/default.wasm"}
        and policy["source"] == full["policy"]["source"]
        and find(F, "Role", "allot-agent-policy")["metadata"]["namespace"] == "net-policies"
        and find(F, "Role", "allot-agent-policy")["rules"][0]["resourceNames"] == ["zone-aware"],
        "policy.sha256": lambda: policy["sha256"] == full["policy"]["sha256"],
        "policy.onFailure": lambda: policy["onFailure"] == "fallback",
        "policy.deadlineMs": lambda: policy["deadlineMs"] == 50 and has(agent, "--policy-deadline-ms=50"),
        "policy.memoryMiB": lambda: policy["memoryMiB"] == 16 and has(agent, "--policy-memory-mib=16"),
        "ipv4.poolName": lambda: v4 is not None,
        "ipv4.subnet": lambda: v4["subnet"] == "10.20.0.0/16" and v4["ipVersion"] == 4 and v4["default"],
        "ipv4.ips": lambda: v4["ips"] == ["10.20.1.0-10.20.1.255", "10.20.3.7"],
        "ipv4.excludeIPs": lambda: v4["excludeIPs"] == ["10.20.1.99"],
        "ipv4.gateway": lambda: v4["gateway"] == "10.20.0.1",
        "ipv4.routes": lambda: v4["routes"] == [{"dst": "10.30.0.0/16", "gw": "10.20.0.254"}],
        "ipv6.poolName": lambda: v6 is not None,
        "ipv6.subnet": lambda: v6["subnet"] == "fd00:20::/64" and v6["ipVersion"] == 6,
        "ipv6.ips": lambda: v6["ips"] == ["fd00:20::100-fd00:20::1ff"],
        "ipv6.excludeIPs": lambda: v6["excludeIPs"] == ["fd00:20::150"],
        "ipv6.gateway": lambda: v6["gateway"] == "fd00:20::1",
        "ipv6.routes": lambda: v6["routes"] == full["ipv6"]["routes"],
        "extraPools": lambda: find(F, "IPPool", "storage-v4")["spec"] == full["extraPools"][0]["spec"],
        "network.name": lambda: conflist["name"] == "storage-net" and find(render(
            "-f", FULL, "--set", "network.conflist.enabled=false,network.multus.enabled=true"),
            "NetworkAttachmentDefinition")["metadata"]["name"] == "storage-net",
        "network.cniVersion": lambda: conflist["cniVersion"] == "1.1.0",
        "network.type": lambda: conflist["plugins"][0]["type"] == "ipvlan",
        "network.config": lambda: {k: conflist["plugins"][0][k] for k in ("master", "mode", "mtu")}
        == full["network"]["config"],
        "network.chained": lambda: conflist["plugins"][1:] == full["network"]["chained"],
        "network.ipam": lambda: ipam["timeout_ms"] == 5000 and ipam["probe"] == full["network"]["ipam"]["probe"]
        and conflist["plugins"][0]["ipam"] == ipam,
        "network.multus.enabled": lambda: nad is not None
        and find(F, "NetworkAttachmentDefinition") is None and find(D, "NetworkAttachmentDefinition") is None,
        "network.multus.namespace": lambda: nad["metadata"]["namespace"] == "underlay-networks",
        "network.conflist.enabled": lambda: "--network=/etc/allot/cni/05-storage.conflist" in init["args"]
        and not any(a.startswith("--network") for a in container(D, "DaemonSet", "allot-agent", True)["args"]),
        "network.conflist.fileName": lambda: "--network-dest=/host/cni/net.d/05-storage.conflist" in init["args"],
        "agent.logLevel": lambda: aenv["RUST_LOG"] == "warn,allot_agent=debug",
        "agent.socketDir": lambda: volumes["socket-dir"] == "/var/run/allot-agent"
        and has(agent, "--socket=/var/run/allot-agent/agent.sock") and ipam["socket"] == "/var/run/allot-agent/agent.sock",
        "agent.journalDir": lambda: volumes["journal"] == "/var/lib/allot-agent/journal"
        and has(agent, "--journal=/var/lib/allot-agent/journal") and ipam["journal"] == "/var/lib/allot-agent/journal",
        "agent.cniBinDir": lambda: volumes["cni-bin"] == "/usr/libexec/cni",
        "agent.cniConfDir": lambda: volumes["cni-conf"] == "/etc/kubernetes/cni/net.d",
        "agent.metrics.port": lambda: has(agent, "--metrics-address=0.0.0.0:19401")
        and agent["ports"][0]["containerPort"] == 19401
        and find(F, "Service", "allot-agent-metrics")["spec"]["ports"][0]["port"] == 19401,
        "agent.podWaitMs": lambda: has(agent, "--pod-wait-ms=3000"),
        "agent.recordDecisions": lambda: has(agent, "--record-decisions=0"),
        "agent.cooldownSeconds": lambda: has(agent, "--cooldown-seconds=45"),
        "agent.statefulsetKeepSeconds": lambda: has(agent, "--statefulset-keep-seconds=3600"),
        "agent.probe.conflict": lambda: has(agent, "--probe-conflict")
        and not has(container(D, "DaemonSet", "allot-agent"), "--probe-conflict"),
        "agent.probe.gateway": lambda: has(agent, "--probe-gateway"),
        "agent.probe.tries": lambda: has(agent, "--probe-tries=5"),
        "agent.probe.timeoutMs": lambda: has(agent, "--probe-timeout-ms=200"),
        "agent.probe.quarantineSeconds": lambda: has(agent, "--quarantine-seconds=600"),
        "agent.probeAhead.enabled": lambda: has(agent, "--probe-ahead")
        and caps.get("add") == ["NET_RAW", "NET_ADMIN"]
        and "add" not in container(D, "DaemonSet", "allot-agent")["securityContext"]["capabilities"],
        "agent.probeAhead.candidates": lambda: has(agent, "--probe-ahead-candidates=4"),
        "agent.probeAhead.freshSeconds": lambda: has(agent, "--probe-ahead-fresh-seconds=20"),
        "agent.probeAhead.rate": lambda: has(agent, "--probe-ahead-rate=10"),
        "agent.resources": lambda: agent["resources"] == full["agent"]["resources"],
        "agent.tolerations": lambda: apod["tolerations"] == full["agent"]["tolerations"],
        "agent.nodeSelector": lambda: apod["nodeSelector"] == full["agent"]["nodeSelector"],
        "agent.affinity": lambda: apod["affinity"] == full["agent"]["affinity"],
        "agent.priorityClassName": lambda: apod["priorityClassName"] == "underlay-critical",
        "agent.updateStrategy": lambda: find(F, "DaemonSet")["spec"]["updateStrategy"] == {"type": "OnDelete"},
        "agent.podAnnotations": lambda: find(F, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]["team"] == "network",
        "agent.extraArgs": lambda: has(agent, "--resync-seconds=120"),
        "agent.extraEnv": lambda: aenv.get("RUST_BACKTRACE") == "1",
        "controller.replicas": lambda: find(F, "Deployment")["spec"]["replicas"] == 3,
        "controller.logLevel": lambda: cenv["RUST_LOG"] == "info,allot_controller=debug",
        "controller.metrics.port": lambda: has(ctrl, "--metrics-address=0.0.0.0:19402")
        and find(F, "Service", "allot-controller-metrics")["spec"]["ports"][0]["port"] == 19402,
        "controller.webhook.port": lambda: has(ctrl, "--webhook-port=19443")
        and {"name": "webhook", "containerPort": 19443, "protocol": "TCP"} in ctrl["ports"],
        "controller.webhook.checkSeconds": lambda: has(ctrl, "--webhook-check-seconds=30"),
        "controller.lease.durationSeconds": lambda: has(ctrl, "--lease-duration-seconds=20"),
        "controller.lease.renewDeadlineSeconds": lambda: has(ctrl, "--lease-renew-deadline-seconds=12"),
        "controller.lease.retryPeriodMs": lambda: has(ctrl, "--lease-retry-period-ms=3000"),
        "controller.statusIntervalSeconds": lambda: has(ctrl, "--status-interval-seconds=7"),
        "controller.gc.enabled": lambda: cenv["ALLOT_GC_IP_ENABLED"] == "false",
        "controller.gc.statelessTerminatingPodOnReadyNode":
            lambda: cenv["ALLOT_GC_STATELESS_TERMINATING_POD_ON_READY_NODE_ENABLED"] == "false",
        "controller.gc.statelessTerminatingPodOnNotReadyNode":
            lambda: cenv["ALLOT_GC_STATELESS_TERMINATING_POD_ON_NOT_READY_NODE_ENABLED"] == "false",
        "controller.gc.statelessRunningPodOnEmptyPodStatusIPs":
            lambda: cenv["ALLOT_GC_ENABLE_STATELESS_RUNNING_POD_ON_EMPTY_POD_STATUS_IPS"] == "true",
        "controller.gc.additionalGraceDelaySeconds": lambda: cenv["ALLOT_GC_ADDITIONAL_GRACE_DELAY"] == "30",
        "controller.gc.intervalSeconds": lambda: cenv["ALLOT_GC_DEFAULT_INTERVAL_DURATION"] == "300",
        "controller.gc.graceSeconds": lambda: cenv["ALLOT_GC_GRACE_SECONDS"] == "90",
        "controller.gc.cleanOutdatedEndpoints": lambda: cenv["ALLOT_GC_CLEAN_OUTDATED_ENDPOINT"] == "true"
        and "endpoints" in rule_resources(F, "allot-controller")
        and "endpoints" not in rule_resources(D, "allot-controller"),
        "controller.autoPools.enabled": lambda: has(ctrl, "--auto-pools=false")
        and "deployments" not in rule_resources(F, "allot-controller")
        and "deployments" in rule_resources(D, "allot-controller"),
        "controller.autoPools.resyncSeconds": lambda: has(ctrl, "--auto-pool-resync-seconds=120"),
        "controller.hostNetwork": lambda: cpod.get("hostNetwork") is True
        and "hostNetwork" not in pod_spec(D, "Deployment", "allot-controller"),
        "controller.resources": lambda: ctrl["resources"] == full["controller"]["resources"],
        "controller.tolerations": lambda: cpod["tolerations"] == full["controller"]["tolerations"],
        "controller.nodeSelector": lambda: cpod["nodeSelector"] == full["controller"]["nodeSelector"],
        "controller.affinity": lambda: cpod["affinity"] == full["controller"]["affinity"],
        "controller.priorityClassName": lambda: cpod["priorityClassName"] == "cluster-critical-net",
        "controller.podDisruptionBudget.enabled": lambda: find(F, "PodDisruptionBudget") is not None
        and find(without("controller.podDisruptionBudget.enabled=false"), "PodDisruptionBudget") is None,
        "controller.podDisruptionBudget.minAvailable": lambda: find(F, "PodDisruptionBudget")["spec"]["minAvailable"] == 2,
        "controller.podAnnotations": lambda: find(F, "Deployment")["spec"]["template"]["metadata"]["annotations"]["team"] == "network",
        "controller.extraArgs": lambda: has(ctrl, "--webhook-address=::"),
        "controller.extraEnv": lambda: cenv.get("SPIDERPOOL_GC_IP_ENABLED") == "false",
        "fleet.enabled": lambda: "clusters" in rule_resources(F, "allot-controller")
        and "clusters" not in rule_resources(D, "allot-controller"),
        "metrics.serviceMonitor.enabled": lambda: find(F, "ServiceMonitor") is not None
        and find(D, "ServiceMonitor") is None,
        "metrics.serviceMonitor.interval": lambda: find(F, "ServiceMonitor")["spec"]["endpoints"][0]["interval"] == "15s",
        "metrics.serviceMonitor.labels": lambda: find(F, "ServiceMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack",
        "metrics.grafanaDashboard.enabled": lambda: find(D, "ConfigMap", "allot-dashboard") is not None
        and find(without("metrics.grafanaDashboard.enabled=false"), "ConfigMap", "allot-dashboard") is None,
        "metrics.grafanaDashboard.namespace": lambda: find(F, "ConfigMap", "allot-dashboard")["metadata"]["namespace"] == "monitoring",
        "metrics.grafanaDashboard.labels": lambda: find(F, "ConfigMap", "allot-dashboard")["metadata"]["labels"]
        == {**find(F, "ConfigMap", "allot-dashboard")["metadata"]["labels"], "team": "network",
            "grafana_dashboard": "allot"},
    }
    # Values whose full-values setting equals the default (a feature the file keeps on, or that
    # excludes another): their checks render with --set or with ci/multus-values.yaml instead.
    kept_default = {"crds.upgrade", "policy.create", "network.multus.enabled",
                    "network.multus.namespace", "controller.podDisruptionBudget.enabled",
                    "metrics.grafanaDashboard.enabled", "image.tag"}
    merged = full
    uncovered = []
    for path, default in leaves(defaults):
        check = checks.get(path) or next((c for p, c in checks.items() if path.startswith(p + ".")), None)
        if check is None:
            uncovered.append(path)
            continue
        if path not in kept_default and lookup(merged, path) == default:
            fail(f"ci/full-values.yaml leaves {path} at its default: its check proves nothing")
        try:
            ok = check()
        except (KeyError, TypeError, IndexError, AttributeError) as e:
            ok, why = False, repr(e)
        else:
            why = ""
        if not ok:
            fail(f"value {path} is not applied as set {why}")
    for path in uncovered:
        fail(f"value {path} of values.yaml is checked nowhere (add it to check_values)")
    say(f"{len(list(leaves(defaults)))} values of values.yaml each land where they should")
    check_images(F, image, "Always", [{"name": "registry-credentials"}], "full values")
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        version = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    chart = load_yaml(os.path.join(CHART, "Chart.yaml"))
    if chart["appVersion"] != version:
        fail(f"Chart.yaml appVersion {chart['appVersion']} is not allot's version {version}")
    check_images(D, f"ghcr.io/allot-ipam/allot:{version}", "IfNotPresent", [], "default values")
    say(f"every container runs the chart's image (tag = appVersion = allot {version}) as set")
    return F, D, M


def check_security(docs, label, probe_ahead):
    """Least privilege of the pods: no privileged container, no escalation, a read-only root,
    every capability dropped; the agent alone on the host network, as root, with host
    directories (exactly the four it needs) and, for probing ahead only, NET_RAW and NET_ADMIN."""
    for d, pod in pods(docs):
        name = d["metadata"]["name"]
        agent = name == "allot-agent"
        where = f"[{label}] {d['kind']} {name}"
        if agent and not pod.get("hostNetwork"):
            fail(f"{where}: the agent must be on the host network")
        host_paths = sorted(v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v)
        if not agent and host_paths:
            fail(f"{where}: host directories {host_paths}")
        if agent and len(host_paths) != 4:
            fail(f"{where}: host directories {host_paths}, expected the CNI plugin and "
                 "configuration directories, the socket's and the journal's")
        if not agent and pod.get("securityContext", {}).get("runAsNonRoot") is not True:
            fail(f"{where}: runs as root")
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c.get("securityContext", {})
            cw = f"{where} container {c['name']}"
            if sc.get("privileged") or sc.get("allowPrivilegeEscalation") is not False:
                fail(f"{cw}: privileged or may escalate")
            if sc.get("readOnlyRootFilesystem") is not True:
                fail(f"{cw}: writable root filesystem")
            if sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
                fail(f"{cw}: no RuntimeDefault seccomp profile")
            caps = sc.get("capabilities", {})
            if caps.get("drop") != ["ALL"]:
                fail(f"{cw}: capabilities not all dropped")
            added = caps.get("add", [])
            allowed = ["NET_RAW", "NET_ADMIN"] if agent and c["name"] == "agent" and probe_ahead else []
            if added != allowed:
                fail(f"{cw}: capabilities {added}, expected {allowed}")
    say(f"[{label}] pods: least privilege (capabilities, root, host network and directories)")


def check_dockerfile(docs):
    """The image the Dockerfile builds has what the chart runs (no engine runs here to build it):
    every /usr/local/bin/X a container runs is copied there, the default Policy's file is the
    component the Dockerfile installs, and the image's user is the one the pods run as."""
    text = open(os.path.join(ROOT, "Dockerfile")).read().replace("\\\n", " ")
    copied = set()
    for cp in re.findall(r"&& cp ([^&\n]*?)\s/out/bin/", text):
        copied |= {os.path.basename(w.strip('"')) for w in cp.split()}
    if "COPY --from=build /out/bin/ /usr/local/bin/" not in text:
        fail("Dockerfile: the binaries are not copied to /usr/local/bin/")
    for d, c in containers(docs):
        name = c["command"][0]
        if not name.startswith("/usr/local/bin/") or os.path.basename(name) not in copied:
            fail(f"{d['metadata']['name']} runs {name}, which the Dockerfile does not install "
                 f"(it installs {sorted(copied)})")
        for a in c.get("args", []):
            if a.startswith("--plugin=") and os.path.basename(a.split("=", 1)[1]) not in copied:
                fail(f"the init container installs {a}, which the Dockerfile does not build")
    policy = find(docs, "Policy")["spec"]["source"]["file"]
    if f"/out/policies/default.wasm {policy}" not in text:
        fail(f"the default Policy reads {policy}, which the Dockerfile does not install")
    user = re.findall(r"^USER (\d+)", text, re.M)
    for d, pod in pods(docs):
        run_as = pod.get("securityContext", {}).get("runAsUser")
        if run_as is not None and [str(run_as)] != user:
            fail(f"{d['metadata']['name']} runs as {run_as}, the image's user is {user}")
    say(f"the Dockerfile installs what the chart runs ({', '.join(sorted(copied))}, the default "
        "policy component) and its user is the pods'")


# 5 -------------------------------------------------------------------------------------------
def check_crds(docs_install, docs_upgrade):
    repo = sorted(os.listdir(os.path.join(ROOT, "crds")))
    repo = [f for f in repo if f.endswith(".yaml")]
    chart = sorted(os.listdir(os.path.join(CHART, "crds")))
    if repo != chart:
        fail(f"charts/allot/crds holds {chart}, crds/ holds {repo}")
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([os.path.join(RELEASE, "allotctl"), "crds", "--out", out], check=True,
                       capture_output=True)
        for name in repo:
            ours = open(os.path.join(CHART, "crds", name)).read()
            for other, label in [(os.path.join(ROOT, "crds", name), "crds/"),
                                 (os.path.join(out, name), "allotctl crds")]:
                theirs = open(other).read() if os.path.exists(other) else ""
                if ours != theirs:
                    diff = "".join(list(difflib.unified_diff(
                        theirs.splitlines(True), ours.splitlines(True), label, "chart"))[:20])
                    fail(f"charts/allot/crds/{name} differs from {label}:\n{diff}")
    say(f"charts/allot/crds equals crds/ and `allotctl crds` ({len(repo)} CRDs)")
    for docs, label in [(docs_install, "install"), (docs_upgrade, "upgrade")]:
        job = find(docs, "Job", "allot-crds")
        if job is None:
            fail(f"no CRD hook Job on {label}")
            continue
        hooks = job["metadata"]["annotations"]["helm.sh/hook"].split(",")
        if sorted(hooks) != ["pre-install", "pre-upgrade"]:
            fail(f"the CRD hook runs on {hooks}, not before install and upgrade")
        c = job["spec"]["template"]["spec"]["containers"][0]
        if c["command"] != ["/usr/local/bin/allotctl"] or c["args"][:2] != ["crds", "--apply"]:
            fail(f"the CRD hook runs {c['command']} {c['args']}")
    say("the CRD hook (allotctl crds --apply) runs before install and upgrade")


def check_previous_chart():
    """An upgrade from the previous chart version, as far as rendering can tell: that version is
    found in git history (the last commit whose Chart.yaml has another version), rendered, and
    its allot objects (Policy, pools) must be valid under this chart's CRDs, which the hook
    installs before anything else; this chart's version must be the higher. The CRDs a previous
    release left are upgraded by the hook in step 7 (from allot's first API)."""
    current = load_yaml(os.path.join(CHART, "Chart.yaml"))["version"]
    log = subprocess.run(["git", "-C", ROOT, "log", "--format=%H", "--", "charts/allot/Chart.yaml"],
                         capture_output=True, text=True)
    previous = None
    for commit in log.stdout.split():
        shown = subprocess.run(["git", "-C", ROOT, "show", f"{commit}:charts/allot/Chart.yaml"],
                               capture_output=True, text=True)
        if shown.returncode == 0 and yaml.safe_load(shown.stdout)["version"] != current:
            previous = (commit, yaml.safe_load(shown.stdout)["version"])
            break
    if previous is None:
        say(f"no earlier chart version than {current} in this clone's history: the upgrade is "
            "checked from the CRDs of allot's first API (step 7)")
        return
    commit, version = previous
    if not version_newer(current, version):
        fail(f"chart version {current} is not higher than the previous {version} ({commit[:8]})")
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", ROOT, "archive", commit, "charts/allot"],
                                 capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        old = render("--set", "ipv4.subnet=10.0.0.0/24,ipv6.subnet=fd00::/64",
                     chart=os.path.join(tmp, "charts", "allot"))
    validators = crd_schemas.validators()
    for d in old:
        if d.get("apiVersion", "").startswith("allot.dev/"):
            v = validators.get((d["apiVersion"], d["kind"]))
            for e in (crd_schemas.errors_of(v, d) if v else ["no CRD for it any more"]):
                fail(f"chart {version}'s {d['kind']} {d['metadata']['name']} under this chart's "
                     f"CRDs: {e}")
    say(f"chart {version} ({commit[:8]}) -> {current}: its objects are valid under the new CRDs")


def version_newer(a, b):
    parse = lambda v: [int(x) for x in re.split(r"[.+-]", v)[:3]]  # noqa: E731
    return parse(a) > parse(b)


# 6 -------------------------------------------------------------------------------------------
def samples(text):
    """Metric name -> label names seen, from Prometheus text."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s", line)
        if m:
            labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
            out.setdefault(m.group(1), set()).update(labels)
    return out


def check_dashboard(docs, agent_metrics, controller_metrics):
    path = os.path.join(CHART, "dashboards", "allot.json")
    dash = json.load(open(path))
    cm = find(docs, "ConfigMap", "allot-dashboard")
    if json.loads(cm["data"]["allot.json"]) != dash:
        fail("the dashboard ConfigMap does not hold dashboards/allot.json")
    for key in ("title", "uid", "schemaVersion", "panels", "templating"):
        if key not in dash:
            fail(f"dashboard: no {key}")
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    if variables.get("datasource", {}).get("type") != "datasource":
        fail("dashboard: no datasource variable (users pick their Prometheus)")
    known = samples(agent_metrics)
    for name, labels in samples(controller_metrics).items():
        known.setdefault(name, set()).update(labels)
    ids, cells, exprs = set(), [], []
    for p in dash["panels"]:
        if p["id"] in ids:
            fail(f"dashboard: panel id {p['id']} twice")
        ids.add(p["id"])
        g = p["gridPos"]
        if g["x"] + g["w"] > 24:
            fail(f"dashboard: panel {p['title']} is wider than the grid")
        for (x, y, w, h, t) in cells:
            if x < g["x"] + g["w"] and g["x"] < x + w and y < g["y"] + g["h"] and g["y"] < y + h:
                fail(f"dashboard: panels {t!r} and {p['title']!r} overlap")
        cells.append((g["x"], g["y"], g["w"], g["h"], p["title"]))
        if p["type"] == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            fail(f"dashboard: panel {p['title']} does not use the datasource variable")
        refs = [t["refId"] for t in p["targets"]]
        if not refs or len(set(refs)) != len(refs):
            fail(f"dashboard: panel {p['title']}: targets need distinct refIds")
        exprs += [(p["title"], t["expr"]) for t in p["targets"]]
    exprs.append(("variable pool", variables["pool"]["definition"]))
    used = set()
    for title, expr in exprs:
        names = set(re.findall(r"\b(allot_[a-z0-9_]+)", expr))
        if not names:
            fail(f"dashboard: {title}: {expr} queries no allot metric")
        labels = set()
        for name in names:
            if name not in known:
                fail(f"dashboard: {title}: {name} is not in the agent's or controller's /metrics")
            labels |= known.get(name, set())
            used.add(name)
        wanted = set(re.findall(r'([a-z_]+)\s*(?:=~|!=|=)\s*"', expr))
        for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            wanted |= {g.strip() for g in group.split(",") if g.strip()}
        wanted |= set(re.findall(r"label_values\([^,]+,\s*([a-z_]+)\)", expr))
        wanted.discard("le")
        for label in sorted(wanted - labels):
            fail(f"dashboard: {title}: label {label} is not on {sorted(names)}")
    for concern, pattern in [("pool usage", "allot_pool_addresses"),
                             ("allocation latency", "allot_add_duration_seconds_bucket"),
                             ("errors by reason", "allot_errors_total"),
                             ("GC releases", "allot_gc_released_total"),
                             ("policy faults", "allot_policy_faults_total")]:
        if pattern not in used:
            fail(f"dashboard: nothing shows {concern} ({pattern})")
    say(f"the dashboard's {len(dash['panels'])} panels query {len(used)} metrics, each served by "
        f"the agent or the controller with the labels used")


# 7 -------------------------------------------------------------------------------------------
DOC_SECTIONS = [("README.md", "## Install on a cluster"),
                ("docs/operations.md", "## On a cluster: the Helm chart")]


def doc_commands(tool):
    """The `tool` commands of the chart's documentation sections, continuation lines joined."""
    commands = []
    for path, heading in DOC_SECTIONS:
        text = open(os.path.join(ROOT, path)).read()
        if heading not in text:
            fail(f"{path}: no section {heading!r}")
            continue
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        for block in re.findall(r"```sh\n(.*?)```", section, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #", 1)[0].strip()
                if line.startswith(tool + " "):
                    commands.append(line)
    return commands


KUBECTL_BUILTIN = {"pod", "pods", "events", "namespace", "daemonset", "deployment",
                   "validatingwebhookconfiguration", "mutatingwebhookconfiguration"}


def notes(*args):
    """NOTES.txt as `helm install` prints it (a client-side dry run needs no cluster)."""
    out = helm("install", "allot", CHART, "-n", NS, "--dry-run=client", *args)
    if "NOTES:" not in out.stdout:
        raise chart_cluster.Failure(f"helm install --dry-run=client {args}: no NOTES")
    return out.stdout.split("NOTES:", 1)[1]


def check_kubectl_commands(multus_docs):
    """What the docs and NOTES.txt tell users to type with kubectl names things that exist:
    files, the chart's objects, allot's resource names, the NetworkAttachmentDefinition."""
    names = set()
    for f in os.listdir(os.path.join(CHART, "crds")):
        crd = load_yaml(os.path.join(CHART, "crds", f))
        n = crd["spec"]["names"]
        names |= {n["plural"], n["singular"], f"{n['plural']}.{crd['spec']['group']}",
                  *n.get("shortNames", [])}
    lines = doc_commands("kubectl")
    for args in ([], ["-f", FULL], ["-f", MULTUS]):
        text = notes(*args)
        lines += [ln.split("  #", 1)[0].strip() for ln in text.splitlines()
                  if ln.strip().startswith("kubectl ")]
        for ln in text.splitlines():
            if ln.strip().startswith("helm ") and "--set" in ln:
                words = shlex.split(ln.strip())
                render(*[a for i, a in enumerate(words) if a == "--set" or words[i - 1] == "--set"])
    for line in lines:
        argv, words = [], shlex.split(line)[1:]
        while words:
            w = words.pop(0)
            if w in ("-n", "--namespace"):
                words.pop(0)
            elif w != "-A":
                argv.append(w)
        for i, a in enumerate(argv):
            if a == "-f" and not os.path.exists(os.path.join(ROOT, argv[i + 1])):
                fail(f"docs: {line}: {argv[i + 1]} does not exist")
            if a.startswith("--annotations=k8s.v1.cni.cncf.io/networks="):
                ns, name = a.split("=", 2)[2].split("/")
                nad = find(multus_docs, "NetworkAttachmentDefinition", name)
                if nad is None or nad["metadata"]["namespace"] != ns:
                    fail(f"docs: {line}: no NetworkAttachmentDefinition {ns}/{name} in the render")
        if argv[0] in ("rollout", "logs"):
            kind, name = argv[-1].split("/")
            if find(multus_docs, {"daemonset": "DaemonSet", "deployment": "Deployment"}[kind], name) is None:
                fail(f"docs: {line}: the chart has no {argv[-1]}")
        if argv[0] in ("get", "delete", "describe") and argv[1] != "-f" and not argv[1].startswith("-"):
            for resource in argv[1].split(","):
                if resource not in names and resource not in KUBECTL_BUILTIN:
                    fail(f"docs: {line}: {resource} is neither allot's nor a Kubernetes resource")
    say(f"{len(lines)} kubectl commands of the docs and NOTES.txt name files, objects and "
        "resources that exist")


def check_readme():
    commands = doc_commands("helm")
    if len(commands) < 3:
        fail(f"the docs' chart sections have {len(commands)} helm commands")
    rendered = []
    for line in commands:
        argv = shlex.split(line)[1:]
        if argv[0] not in ("install", "upgrade"):
            continue
        upgrade = argv[0] == "upgrade"
        args, i = [], 1
        name, chart = argv[1], argv[2]
        rest = argv[3:]
        while i <= len(rest):
            a = rest[i - 1]
            if a in ("--create-namespace", "--install", "--wait", "--reuse-values"):
                pass
            elif a in ("-n", "--namespace"):
                i += 1
            elif a.startswith("--set") or a in ("-f", "--values"):
                value = rest[i]
                args += [a, os.path.join(ROOT, value) if a in ("-f", "--values") else value]
                i += 1
            else:
                fail(f"README: {line}: {a} is not understood by this check")
            i += 1
        docs = render(*args, upgrade=upgrade, chart=os.path.join(ROOT, chart), name=name)
        check_schemas(docs, f"README: {line[:60]}…")
        rendered.append((line, docs))
    return rendered


def run_cluster(docs, label):
    chart_crds = {}
    for name in os.listdir(os.path.join(CHART, "crds")):
        crd = load_yaml(os.path.join(CHART, "crds", name))
        chart_crds[crd["metadata"]["name"]] = crd
    run = chart_cluster.Run(docs, NS, label)
    ok = False
    try:
        run.crd_hook(os.path.join(ROOT, "tests", "fixtures", "crds-699f2d6"), chart_crds)
        run.release_objects()
        args = find(docs, "Deployment", "allot-controller")["spec"]["template"]["spec"][
            "containers"][0]["args"]
        service = next(a.split("=", 1)[1] for a in args if a.startswith("--webhook-service="))
        if find(docs, "Service", service) is None:
            raise chart_cluster.Failure(f"the controller's --webhook-service={service} is not a "
                                        "Service of the chart")
        run.controller(find(docs, "Service", service))
        run.node()
        run.first_pod()
        run.uninstall()
        run.audit(chart_cluster.Rbac(docs))
        for m in run.mapped:
            print(f"check-chart: [{label}] mapped: {m}")
        ok = True
        return run.agent_metrics, run.controller_metrics
    finally:
        run.close(ok)


def main():
    for tool in (HELM, os.path.join(RELEASE, "allotctl"), os.path.join(RELEASE, "allot-test-apiserver")):
        if not os.access(tool, os.X_OK):
            sys.exit(f"check-chart: {tool} is missing: run scripts/setup.sh and cargo build --release")
    try:
        check_lint()
        check_rbac_comments()
        F, D, M = check_values()
        upgrade = render(upgrade=True)
        for docs, label in [(D, "default values"), (F, "full values"), (M, "multus values"),
                            (upgrade, "upgrade")]:
            check_schemas(docs, label)
            check_rbac(docs, label)
            check_security(docs, label, probe_ahead=docs is F)
        check_crds(D, upgrade)
        check_dockerfile(D)
        check_previous_chart()
        readme = check_readme()
        check_kubectl_commands(render("--set", "network.multus.enabled=true"))
        quick_line, quick = readme[0]
        say(f"running the README's first install: {quick_line}")
        agent_metrics, controller_metrics = run_cluster(quick, "README install")
        run_cluster(M, "multus values")
        full_agent, full_controller = run_cluster(F, "full values")
        check_dashboard(D, agent_metrics + full_agent, controller_metrics + full_controller)
    except chart_cluster.Failure as e:
        fail(str(e))
    except (KeyError, IndexError, TypeError, StopIteration, ValueError) as e:
        import traceback
        traceback.print_exc()
        fail(f"the rendered chart lacks something the checks look for: {e!r}")
    if failures:
        sys.exit(f"check-chart: {len(failures)} failure(s)")
    say("all checks passed")


if __name__ == "__main__":
    main()
