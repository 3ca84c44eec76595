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
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile

import kubernetes_validate
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chart_cluster  # noqa: E402
from chart_common import (CHART, HELM, KUBE_VERSIONS, NS, RELEASE, ROOT,  # noqa: E402
                          containers, crd_schemas, fail, failures, find, helm, load_yaml, pods,
                          render, say)
from chart_docs import check_dashboard, check_kubectl_commands, check_readme  # noqa: E402
from chart_values import check_values  # noqa: E402


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
            # resource.k8s.io/v1 (the DeviceClass of resourceSlices.enabled) is served from
            # Kubernetes 1.34 (DRA GA): older versions have no schema for it.
            versions = [v for v in KUBE_VERSIONS
                        if api != "resource.k8s.io/v1" or version_newer(v, "1.33.99")]
            for version in versions:
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


def check_security(docs, label, probe_ahead):
    """Least privilege of the pods: no privileged container, no escalation, a read-only root,
    every capability dropped; the agent alone on the host network, as root, with host
    directories (exactly the four it needs, and the runtime's netns directory, read-only, to
    announce after live migrations) and, for probing ahead only, NET_RAW and NET_ADMIN, for
    announcing after live migrations only, NET_RAW and SYS_ADMIN. `probe_ahead` stands for the
    full values, which turn both on."""
    for d, pod in pods(docs):
        name = d["metadata"]["name"]
        agent = name == "allot-agent"
        where = f"[{label}] {d['kind']} {name}"
        if agent and not pod.get("hostNetwork"):
            fail(f"{where}: the agent must be on the host network")
        host_paths = sorted(v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v)
        if not agent and host_paths:
            fail(f"{where}: host directories {host_paths}")
        if agent and len(host_paths) != (5 if probe_ahead else 4):
            fail(f"{where}: host directories {host_paths}, expected the CNI plugin and "
                 "configuration directories, the socket's and the journal's (and the netns "
                 "directory when announcing after live migrations)")
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
            allowed = (["NET_RAW", "NET_ADMIN", "SYS_ADMIN"]
                       if agent and c["name"] == "agent" and probe_ahead else [])
            if agent and c["name"] == "agent" and probe_ahead:
                netns = [m for m in c.get("volumeMounts", []) if m["name"] == "netns"]
                if not netns or netns[0].get("readOnly") is not True \
                        or netns[0].get("mountPropagation") != "HostToContainer":
                    fail(f"{cw}: the netns directory must be mounted read-only, HostToContainer")
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
        # What `make cluster`'s README section installs on the local control plane.
        local = render("-f", os.path.join(CHART, "ci", "local-cluster-values.yaml"))
        for docs, label in [(D, "default values"), (F, "full values"), (M, "multus values"),
                            (local, "local cluster values"), (upgrade, "upgrade")]:
            check_schemas(docs, label)
            check_rbac(docs, label)
            check_security(docs, label, probe_ahead=docs is F)
        check_crds(D, upgrade)
        check_dockerfile(D)
        check_previous_chart()
        readme = check_readme()
        for line, docs in readme:
            check_schemas(docs, f"docs: {line[:60]}…")
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
