"""The dashboard and the documentation (scripts/check-chart.py, steps 6 and 2): the dashboard's
queries against real /metrics, and what the README, docs/chart.md and NOTES.txt tell users
to type, rendered or looked up."""
import json
import os
import re
import shlex

import chart_cluster
from chart_common import CHART, FULL, MULTUS, NS, ROOT, fail, find, helm, load_yaml, render, say


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
                ("docs/chart.md", "## On a cluster: the Helm chart"),
                ("docs/fleet.md", "### RBAC"),
                ("docs/migration.md", "## The switch-over sequence")]


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
        rendered.append((line, docs))
    return rendered
