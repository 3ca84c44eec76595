"""What scripts/check-chart.py and its parts share: paths, helm, rendering, reporting, and
looking things up in rendered objects."""
import importlib.util
import os
import subprocess
import sys

import kubernetes_validate
import yaml

import chart_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(ROOT, "charts", "allot")
HELM = os.path.join(ROOT, "target", "tools", "helm")
# Cargo's target directory, as cargo finds it (CARGO_TARGET_DIR moves it).
TARGET = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
RELEASE = os.path.join(TARGET, "release")
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


def pods(docs):
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet", "Job"):
            yield d, d["spec"]["template"]["spec"]


def containers(docs):
    for d, pod in pods(docs):
        for c in pod.get("initContainers", []) + pod["containers"]:
            yield d, c


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
