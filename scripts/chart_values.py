"""Every value of charts/allot/values.yaml lands where it should (scripts/check-chart.py, step
4): ci/full-values.yaml sets each to something else than its default, and a check per value
looks for it in the rendered objects; a value no check covers fails the run."""
import copy
import json
import os
import re

from chart_common import (CHART, FULL, MULTUS, ROOT, container, containers, env, fail, find,
                          load_yaml, pod_spec, pods, render, say)


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


def rule_resources(docs, role):
    return {r for rule in find(docs, "ClusterRole", role)["rules"] for r in rule["resources"]}


def rule_verbs(docs, role, resource):
    return {v for rule in find(docs, "ClusterRole", role)["rules"]
            if resource in rule["resources"] for v in rule["verbs"]}


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

    def rolling(docs):
        return find(docs, "Deployment", "allot-controller")["spec"]["strategy"]["rollingUpdate"]

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
        "agent.metrics.port": lambda: has(agent, "--metrics-address=[::]:19401")
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
        and "NET_ADMIN" in caps.get("add", [])
        and "add" not in container(D, "DaemonSet", "allot-agent")["securityContext"]["capabilities"],
        "agent.liveMigration.announce": lambda: has(agent, "--announce-after-migration")
        and caps.get("add") == ["NET_RAW", "NET_ADMIN", "SYS_ADMIN"]
        and not has(container(D, "DaemonSet", "allot-agent"), "--announce-after-migration")
        and all(v["name"] != "netns" for v in pod_spec(D, "DaemonSet", "allot-agent")["volumes"]),
        "agent.liveMigration.netnsDir": lambda: volumes["netns"] == "/var/run/netns"
        and any(m["name"] == "netns" and m["mountPath"] == "/var/run/netns"
                for m in agent["volumeMounts"]),
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
        "controller.metrics.port": lambda: has(ctrl, "--metrics-address=[::]:19402")
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
        and "delete" in rule_verbs(F, "allot-controller", "endpoints")
        and "delete" not in rule_verbs(D, "allot-controller", "endpoints"),
        "controller.audit.intervalSeconds": lambda: has(ctrl, "--audit-interval-seconds=45")
        and {"get", "list", "watch"} <= rule_verbs(D, "allot-controller", "endpoints"),
        "controller.autoPools.enabled": lambda: has(ctrl, "--auto-pools=false")
        and "deployments" not in rule_resources(F, "allot-controller")
        and "deployments" in rule_resources(D, "allot-controller"),
        "controller.autoPools.resyncSeconds": lambda: has(ctrl, "--auto-pool-resync-seconds=120"),
        "controller.autoPools.discoverySeconds": lambda: has(ctrl, "--auto-pool-discovery-seconds=30"),
        # Each entry grants its resources and their scale; auto-pools off grants none.
        "controller.autoPools.scalableWorkloads": lambda: {
            "clonesets", "clonesets/scale", "statefulsets/scale"} <= rule_resources(D, "allot-controller")
        and "clonesets" not in rule_resources(F, "allot-controller")
        and (lambda r: "rollouts/scale" in r and "clonesets" not in r)(rule_resources(render(
            "--set-json", 'controller.autoPools.scalableWorkloads=[{"group":"argoproj.io","resources":["rollouts"]}]'),
            "allot-controller")),
        # Unset: on the host network exactly when allot's conflist is the pod network.
        "controller.hostNetwork": lambda: cpod.get("hostNetwork") is True
        and "hostNetwork" not in pod_spec(D, "Deployment", "allot-controller")
        and pod_spec(without("network.conflist.enabled=true"), "Deployment",
                     "allot-controller").get("hostNetwork") is True
        and "hostNetwork" not in pod_spec(
            without("network.conflist.enabled=true", "controller.hostNetwork=false"),
            "Deployment", "allot-controller")
        # On the host network a surge replica needs a node of its own: one at a time instead.
        and rolling(F) == {"maxUnavailable": 1, "maxSurge": 0}
        and rolling(D) == {"maxUnavailable": 0, "maxSurge": 1}
        and rolling(without("network.conflist.enabled=true", "controller.replicas=1"))
        == {"maxUnavailable": 0, "maxSurge": 1},
        "controller.resources": lambda: ctrl["resources"] == full["controller"]["resources"],
        # The default classes are system-*-critical: a quota admits them outside kube-system;
        # the full values' classes are not, so no quota.
        "priorityClassQuota.enabled": lambda: find(F, "ResourceQuota") is None
        and find(D, "ResourceQuota", "allot-critical-pods")["spec"]["scopeSelector"]
        == {"matchExpressions": [{"operator": "In", "scopeName": "PriorityClass",
                                  "values": ["system-node-critical", "system-cluster-critical"]}]}
        and find(without("priorityClassQuota.enabled=false"), "ResourceQuota") is None,
        "priorityClassQuota.pods": lambda: find(without("priorityClassQuota.pods=500"),
                                                "ResourceQuota")["spec"]["hard"] == {"pods": "500"},
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
        and "clusters" not in rule_resources(D, "allot-controller")
        and has(ctrl, "--fleet=true") and "--fleet=false" in container(D, "Deployment", "allot-controller")["args"],
        "fleet.datacenterLabel": lambda: has(ctrl, "--fleet-datacenter-label=topology.example.com/datacenter"),
        "fleet.resyncSeconds": lambda: has(ctrl, "--fleet-resync-seconds=300"),
        "fleet.workloadConfigMap.enabled": lambda: has(ctrl, "--fleet-workload-configmap=true")
        and "secrets" in {r for rule in find(F, "ClusterRole", "allot-controller")["rules"]
                          if rule["verbs"] == ["get"] for r in rule["resources"]}
        and "secrets" not in rule_resources(without("fleet.enabled=true", "fleet.workloadConfigMap.enabled=false"), "allot-controller"),
        "fleet.workloadConfigMap.namespace": lambda: has(ctrl, "--fleet-workload-namespace=metallb-system"),
        "resourceSlices.enabled": lambda: "resourceslices" in rule_resources(F, "allot-controller")
        and "resourceslices" not in rule_resources(D, "allot-controller")
        and find(F, "DeviceClass", "ipam.allot.dev") is not None and find(D, "DeviceClass") is None
        and has(ctrl, "--resource-slices=true")
        and "--resource-slices=false" in container(D, "Deployment", "allot-controller")["args"],
        "resourceSlices.pollMs": lambda: has(ctrl, "--resource-slices-poll-ms=700"),
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
                    "metrics.grafanaDashboard.enabled", "image.tag", "priorityClassQuota.enabled"}
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
