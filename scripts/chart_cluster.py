"""The chart's rendered commands, run with this tree's binaries against the in-memory API server
(`target/release/allot-test-apiserver`, allot's tests/apiserver as a process), as far as a
cluster can be had here. Used by scripts/check-chart.py.

What runs, in the order Helm and the kubelet would run it:
 1. The CRD hook Job's command, on a cluster holding the CRDs of allot's first API
    (tests/fixtures/crds-699f2d6): afterwards the stored CRDs are exactly charts/allot/crds.
 2. The release's Policy and IPPools are created (as Helm applies them).
 3. The controller Deployment's command, arguments and environment: it becomes ready, leads,
    makes its certificate Secret and both webhook configurations, which must point at the
    chart's webhook Service; it writes the pools' status.
 4. The agent DaemonSet's init container (into temporary node directories) and agent: ready,
    serving the Policy's component (its status names the digest).
 5. A first pod: the installed plugin, given the installed network configuration (or the NAD's),
    hands it an address from the chart's pool, the Endpoint appears, DEL releases it.
 6. The uninstall hook, once the controller has stopped: both webhook configurations go.
 7. Every request each process made, under its ServiceAccount, is allowed by the chart's RBAC.

Paths of the image (/usr/local/bin/…) and of the node (hostPath mounts) are mapped to the build
and to temporary directories; nothing else of what was rendered is changed, except as `mapped`
lines of the output say.
"""
import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Cargo's target directory, as cargo finds it (CARGO_TARGET_DIR moves it).
TARGET = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
RELEASE = os.path.join(TARGET, "release")
DEFAULT_POLICY = os.path.join(
    TARGET, "wasm-default-policy", "wasm32-wasip2", "release", "allot_policy_default.wasm"
)
SETUP = "chart-check-setup"

PLURALS = {
    "CustomResourceDefinition": "customresourcedefinitions",
    "Namespace": "namespaces",
    "Node": "nodes",
    "Pod": "pods",
    "ConfigMap": "configmaps",
    "IPPool": "ippools",
    "Policy": "policies",
    "Endpoint": "endpoints",
    "Lease": "leases",
    "Secret": "secrets",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
}
NAMESPACED = {"Pod", "ConfigMap", "Endpoint", "Lease", "Secret"}


class Failure(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, check, timeout=30.0, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise Failure(f"{what}: the process exited with {proc.returncode}:\n{proc.log()}")
        time.sleep(0.05)
    raise Failure(f"{what}: not within {timeout:.0f} s" + (f"\n{proc.log()}" if proc else ""))


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""


class Process:
    """A child process whose output goes to a file (read back when something fails)."""

    def __init__(self, argv, env, log_dir, name):
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log_file, stderr=subprocess.STDOUT)

    def poll(self):
        return self.proc.poll()

    @property
    def returncode(self):
        return self.proc.returncode

    def log(self):
        self.log_file.flush()
        with open(self.log_path) as f:
            return "".join(f.readlines()[-40:])

    def stop(self, timeout=10):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


class ApiServer:
    def __init__(self):
        self.proc = subprocess.Popen(
            [os.path.join(RELEASE, "allot-test-apiserver")],
            stdout=subprocess.PIPE,
            text=True,
        )
        first = self.proc.stdout.readline()
        if not first.startswith("listening on "):
            raise Failure(f"allot-test-apiserver: {first!r}")
        self.url = "http://" + first.split()[-1]
        self.requests = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.requests.append(json.loads(line))
            except ValueError:
                pass

    def stop(self):
        self.proc.kill()
        self.proc.wait()

    def kubeconfig(self, directory, user):
        path = os.path.join(directory, f"kubeconfig-{user.rsplit(':', 1)[-1]}")
        with open(path, "w") as f:
            yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": self.url}}],
                "users": [{"name": "u", "user": {"token": user}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }, f)
        return path

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {SETUP}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    @staticmethod
    def path(api_version, kind, namespace=None, name=None):
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        if kind in NAMESPACED and namespace:
            base += f"/namespaces/{namespace}"
        base += "/" + PLURALS[kind]
        return base + (f"/{name}" if name else "")

    def create(self, obj):
        meta = obj["metadata"]
        path = self.path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        code, body = self.call("POST", path, obj)
        if code not in (200, 201):
            raise Failure(f"creating {obj['kind']} {meta['name']}: {code} {body}")
        return body

    def get(self, api_version, kind, name, namespace=None):
        code, body = self.call("GET", self.path(api_version, kind, namespace, name))
        return body if code == 200 else None

    def list(self, api_version, kind):
        code, body = self.call("GET", self.path(api_version, kind))
        return body["items"] if code == 200 else []


def container_of(docs, kind, name, container=None, init=False):
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            spec = d["spec"]["template"]["spec"]
            for c in spec.get("initContainers" if init else "containers", []):
                if container is None or c["name"] == container:
                    return c
    raise Failure(f"no container in {kind} {name}")


def binary(command):
    """/usr/local/bin/X of the image -> target/release/X."""
    if not command.startswith("/usr/local/bin/"):
        raise Failure(f"{command}: not one of the image's binaries")
    return os.path.join(RELEASE, os.path.basename(command))


def env_of(container, fields):
    env = {"PATH": os.environ.get("PATH", "")}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def expand(arg, env):
    for k, v in env.items():
        arg = arg.replace(f"$({k})", v)
    return arg


def replace_flag(args, flag, value, mapped):
    out = []
    for a in args:
        if a.startswith(flag + "="):
            mapped.append(f"{a} -> {flag}={value}")
            a = f"{flag}={value}"
        out.append(a)
    return out


class Run:
    """One release's rendered objects, run."""

    def __init__(self, docs, namespace, label):
        self.docs = docs
        self.ns = namespace
        self.label = label
        self.tmp = tempfile.mkdtemp(prefix="allot-chart-")
        self.server = ApiServer()
        self.procs = []
        self.mapped = []

    def sa(self, name):
        return f"system:serviceaccount:{self.ns}:{name}"

    def say(self, text):
        print(f"check-chart: [{self.label}] {text}")

    def close(self, ok):
        for p in self.procs:
            p.stop()
        self.server.stop()
        if ok:
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            print(f"check-chart: [{self.label}] logs and files kept in {self.tmp}")

    def objects(self, kind):
        return [d for d in self.docs if d["kind"] == kind]

    # 1 ---------------------------------------------------------------------------------------
    def crd_hook(self, previous_dir, chart_crds):
        for name in sorted(os.listdir(previous_dir)):
            if name.endswith(".yaml"):
                with open(os.path.join(previous_dir, name)) as f:
                    self.server.create(yaml.safe_load(f))
        job = container_of(self.docs, "Job", "allot-crds")
        kubeconfig = self.server.kubeconfig(self.tmp, self.sa("allot-crds"))
        argv = [binary(job["command"][0]), "--kubeconfig", kubeconfig, *job["args"]]
        out = subprocess.run(argv, env=env_of(job, {}), capture_output=True, text=True, timeout=90)
        if out.returncode:
            raise Failure(f"the CRD hook failed:\n{out.stdout}{out.stderr}")
        stored = {c["metadata"]["name"]: c for c in
                  self.server.list("apiextensions.k8s.io/v1", "CustomResourceDefinition")}
        if sorted(stored) != sorted(chart_crds):
            raise Failure(f"CRDs after the hook: {sorted(stored)}, the chart's: {sorted(chart_crds)}")
        for name, crd in chart_crds.items():
            if stored[name]["spec"] != crd["spec"]:
                raise Failure(f"{name}: the hook left a spec other than charts/allot/crds")
        self.say(f"the CRD hook upgraded {len(os.listdir(previous_dir)) - 1} CRDs of allot's "
                 f"first API to the chart's {len(chart_crds)}")

    # 2 ---------------------------------------------------------------------------------------
    def release_objects(self):
        self.server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}})
        self.server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
        self.server.create({"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": "node-1", "labels": {"kubernetes.io/os": "linux"}}})
        with open(DEFAULT_POLICY, "rb") as f:
            wasm = f.read()
        for policy in self.objects("Policy"):
            policy = json.loads(json.dumps(policy))
            source = policy["spec"]["source"]
            if "file" in source:
                self.mapped.append(f"Policy file {source['file']} -> {DEFAULT_POLICY}")
                source["file"] = DEFAULT_POLICY
            if "configMap" in source:
                cm = source["configMap"]
                self.server.create({"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": cm["namespace"]}})
                self.server.create({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"namespace": cm["namespace"], "name": cm["name"]},
                    "binaryData": {cm["key"]: base64.b64encode(wasm).decode()}})
            if "sha256" in policy["spec"]:
                self.mapped.append("Policy sha256 -> the built default policy's")
                policy["spec"]["sha256"] = "sha256:" + hashlib.sha256(wasm).hexdigest()
            self.server.create(policy)
        for pool in self.objects("IPPool"):
            self.server.create(pool)

    # 3 ---------------------------------------------------------------------------------------
    def controller(self, webhook_service):
        c = container_of(self.docs, "Deployment", "allot-controller")
        env = env_of(c, {"metadata.namespace": self.ns, "metadata.name": "allot-controller-0"})
        metrics = free_port()
        args = replace_flag(c["args"], "--metrics-address", f"127.0.0.1:{metrics}", self.mapped)
        args = replace_flag(args, "--webhook-port", str(free_port()), self.mapped)
        kubeconfig = self.server.kubeconfig(self.tmp, self.sa("allot-controller"))
        argv = [binary(c["command"][0]), "--kubeconfig", kubeconfig, *args]
        self.controller_proc = Process(argv, env, self.tmp, "controller")
        self.procs.append(self.controller_proc)
        url = f"http://127.0.0.1:{metrics}"
        wait_for("the controller's /readyz", lambda: http_get(url + "/readyz")[0] == 200,
                 proc=self.controller_proc)
        validating = wait_for(
            "the controller's ValidatingWebhookConfiguration",
            lambda: self.server.get("admissionregistration.k8s.io/v1",
                                    "ValidatingWebhookConfiguration", "allot"),
            proc=self.controller_proc)
        mutating = self.server.get("admissionregistration.k8s.io/v1",
                                   "MutatingWebhookConfiguration", "allot")
        if mutating is None:
            raise Failure("no MutatingWebhookConfiguration allot")
        port = webhook_service["spec"]["ports"][0]["port"]
        want = {"name": webhook_service["metadata"]["name"], "namespace": self.ns, "port": port}
        for config in (validating, mutating):
            for hook in config["webhooks"]:
                service = hook["clientConfig"]["service"]
                got = {k: service.get(k) for k in want}
                if got != want:
                    raise Failure(f"{config['kind']} {hook['name']} calls {got}, the chart's "
                                  f"Service is {want}")
                if not hook["clientConfig"].get("caBundle"):
                    raise Failure(f"{hook['name']}: no caBundle")
        if self.server.get("v1", "Secret", "allot-webhook-tls", self.ns) is None:
            raise Failure("no webhook Secret allot-webhook-tls")
        lease = self.server.get("coordination.k8s.io/v1", "Lease", "allot-controller", self.ns)
        if not lease or lease["spec"].get("holderIdentity") != "allot-controller-0":
            raise Failure(f"the Lease allot-controller is not held by the replica: {lease}")
        for pool in self.objects("IPPool"):
            name = pool["metadata"]["name"]
            wait_for(f"status counts of IPPool {name}", lambda: (self.server.get(
                "allot.dev/v1alpha1", "IPPool", name) or {}).get("status", {}).get("totalIPCount"),
                proc=self.controller_proc)
        self.controller_metrics = http_get(url + "/metrics")[1]
        self.say("the controller leads, made its Secret and both webhook configurations (calling "
                 f"Service {want['name']}:{port}), and counts {len(self.objects('IPPool'))} pool(s)")

    # 4 ---------------------------------------------------------------------------------------
    def node(self):
        init = container_of(self.docs, "DaemonSet", "allot-agent", init=True)
        agent = container_of(self.docs, "DaemonSet", "allot-agent", "agent")
        ds = next(d for d in self.docs if d["kind"] == "DaemonSet")
        pod = ds["spec"]["template"]["spec"]
        cm = next(d for d in self.docs if d["kind"] == "ConfigMap" and
                  d["metadata"]["name"] == "allot-cni")
        # The pod's mounts -> directories of this run.
        mounts = {}
        node_dirs = {}
        for v in pod["volumes"]:
            local = os.path.join(self.tmp, "vol-" + v["name"])
            os.makedirs(local, exist_ok=True)
            if "configMap" in v:
                for key, text in cm["data"].items():
                    with open(os.path.join(local, key), "w") as f:
                        f.write(text)
            if "hostPath" in v:
                node_dirs[v["hostPath"]["path"]] = local
            mounts[v["name"]] = local

        def mapped_path(container, path):
            for m in sorted(container["volumeMounts"], key=lambda m: -len(m["mountPath"])):
                if path == m["mountPath"] or path.startswith(m["mountPath"] + "/"):
                    return mounts[m["name"]] + path[len(m["mountPath"]):]
            return binary(path) if path.startswith("/usr/local/bin/") else path

        def mapped_args(container):
            out = []
            for a in container["args"]:
                if a.startswith("--") and "=" in a:
                    flag, value = a.split("=", 1)
                    if value.startswith("/"):
                        a = f"{flag}={mapped_path(container, value)}"
                out.append(a)
            return out

        argv = [binary(init["command"][0]), *mapped_args(init)]
        out = subprocess.run(argv, env=env_of(init, {}), capture_output=True, text=True, timeout=30)
        if out.returncode:
            raise Failure(f"the init container failed:\n{out.stdout}{out.stderr}")
        self.cni_bin = node_dirs[ds_value(pod, "cni-bin")]
        self.cni_conf = node_dirs[ds_value(pod, "cni-conf")]
        installed = json.load(open(os.path.join(self.cni_conf, "allot.d", "ipam.json")))
        if installed != json.loads(cm["data"]["ipam.json"]):
            raise Failure("the ipam piece installed differs from the ConfigMap's")
        self.conflist = None
        for key in cm["data"]:
            if key.endswith(".conflist"):
                self.conflist = json.load(open(os.path.join(self.cni_conf, key)))
        self.say("the init container installed the plugin and "
                 + ("the ipam piece and the network configuration list" if self.conflist
                    else "the ipam piece"))

        env = env_of(agent, {"spec.nodeName": "node-1"})
        env["NODE_NAME"] = "node-1"
        metrics = free_port()
        args = [expand(a, env) for a in mapped_args(agent)]
        args = replace_flag(args, "--metrics-address", f"127.0.0.1:{metrics}", self.mapped)
        self.socket = next(a.split("=", 1)[1] for a in args if a.startswith("--socket="))
        self.journal = next(a.split("=", 1)[1] for a in args if a.startswith("--journal="))
        kubeconfig = self.server.kubeconfig(self.tmp, self.sa("allot-agent"))
        self.agent_proc = Process([binary(agent["command"][0]), "--kubeconfig", kubeconfig, *args],
                                  env, self.tmp, "agent")
        self.procs.append(self.agent_proc)
        url = f"http://127.0.0.1:{metrics}"
        wait_for("the agent's /readyz", lambda: http_get(url + "/readyz")[0] == 200,
                 proc=self.agent_proc)
        for policy in self.objects("Policy"):
            name = policy["metadata"]["name"]
            digest = wait_for(f"Policy {name} served", lambda: (self.server.get(
                "allot.dev/v1alpha1", "Policy", name) or {}).get("status", {}).get("servingDigest"),
                proc=self.agent_proc)
            self.say(f"the agent is ready and serves Policy {name} ({digest[:19]}…)")
        self.agent_metrics_url = url

    # 5 ---------------------------------------------------------------------------------------
    def first_pod(self):
        if self.conflist is not None:
            net = self.conflist
            source = "the installed network configuration list"
        else:
            nads = self.objects("NetworkAttachmentDefinition")
            if nads:
                net = json.loads(nads[0]["spec"]["config"])
                source = "the NetworkAttachmentDefinition"
            else:
                ipam = json.load(open(os.path.join(self.cni_conf, "allot.d", "ipam.json")))
                net = {"cniVersion": "1.0.0", "name": "allot-underlay",
                       "plugins": [{"type": "macvlan", "master": "eth0", "ipam": ipam}]}
                source = "a configuration made from the installed ipam piece"
        plugin = next(p for p in net["plugins"] if p.get("ipam", {}).get("type") == "allot")
        conf = {"cniVersion": net["cniVersion"], "name": net["name"], **plugin}
        conf["ipam"] = dict(conf["ipam"])
        # The node's socket and journal, as the agent's hostPath mounts map them here.
        conf["ipam"]["socket"] = self.socket
        conf["ipam"]["journal"] = self.journal
        if "probe" in conf["ipam"]:
            self.mapped.append("ipam.probe -> {} (probing needs the pod's interface: e2e tests)")
            conf["ipam"]["probe"] = {}
        stored = self.server.create({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "default", "name": "first"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "pause"}]}})
        uid = stored["metadata"]["uid"]

        def cni(command):
            env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "first-sandbox",
                   "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "eth0",
                   "CNI_PATH": self.cni_bin,
                   "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=first;"
                               f"K8S_POD_UID={uid}"}
            out = subprocess.run([os.path.join(self.cni_bin, "allot")], input=json.dumps(conf),
                                 env=env, capture_output=True, text=True, timeout=30)
            if out.returncode:
                raise Failure(f"CNI {command} with {source}: {out.stdout}{out.stderr}")
            return json.loads(out.stdout) if out.stdout.strip() else {}

        result = cni("ADD")
        addresses = [ip["address"] for ip in result.get("ips", [])]
        if not addresses:
            raise Failure(f"ADD gave no address: {result}")
        endpoint = wait_for("the pod's Endpoint", lambda: self.server.get(
            "allot.dev/v1alpha1", "Endpoint", "first", "default"), proc=self.agent_proc)
        self.say(f"a first pod got {', '.join(addresses)} through {source}; its Endpoint names "
                 f"{', '.join(sorted({p for i in endpoint['spec'].get('interfaces', []) for p in i.get('pools', [])}))}")
        # A failed request (CHECK of a container the agent never saw), so that the errors
        # family is in the metrics the dashboard is checked against; then DEL.
        code = unix_post(self.socket, "/v1/check", {"containerId": "unknown", "ifName": "eth0"})
        if code != 404:
            raise Failure(f"CHECK of an unknown container: {code}, expected 404")
        self.agent_metrics = http_get(self.agent_metrics_url + "/metrics")[1]
        cni("DEL")
        wait_for("the Endpoint removed after DEL", lambda: self.server.get(
            "allot.dev/v1alpha1", "Endpoint", "first", "default") is None, proc=self.agent_proc)
        return addresses

    # 6 ---------------------------------------------------------------------------------------
    def uninstall(self):
        self.agent_proc.stop()
        self.controller_proc.stop()
        job = container_of(self.docs, "Job", "allot-uninstall")
        kubeconfig = self.server.kubeconfig(self.tmp, self.sa("allot-uninstall"))
        args = replace_flag(job["args"], "--metrics-address", f"127.0.0.1:{free_port()}", self.mapped)
        argv = [binary(job["command"][0]), "--kubeconfig", kubeconfig, *args]
        out = subprocess.run(argv, env=env_of(job, {}), capture_output=True, text=True, timeout=90)
        if out.returncode:
            raise Failure(f"the uninstall hook failed:\n{out.stdout}{out.stderr}")
        for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            if self.server.get("admissionregistration.k8s.io/v1", kind, "allot") is not None:
                raise Failure(f"{kind} allot is left after the uninstall hook")
        self.say("after the controller stopped, the uninstall hook removed both webhook "
                 "configurations")

    # 7 ---------------------------------------------------------------------------------------
    def audit(self, rbac):
        by_user = {}
        for r in self.server.requests:
            if r["user"] != SETUP:
                by_user.setdefault(r["user"], []).append(r)
        for user, requests in sorted(by_user.items()):
            denied = sorted({describe(r) for r in requests if not rbac.allows(user, r)})
            if denied:
                raise Failure(f"{user} made requests the chart's RBAC does not allow:\n  "
                              + "\n  ".join(denied))
            self.say(f"RBAC allows all {len(requests)} requests of {user.rsplit(':', 1)[-1]}")
        for expected in ("allot-crds", "allot-controller", "allot-agent", "allot-uninstall"):
            if self.sa(expected) not in by_user:
                raise Failure(f"no request was made as {expected}: the audit saw nothing of it")


def unix_post(path, url_path, body):
    data = json.dumps(body).encode()
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(f"POST {url_path} HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


def ds_value(pod, volume):
    return next(v["hostPath"]["path"] for v in pod["volumes"] if v["name"] == volume)


def describe(r):
    res = r["resource"] + (f"/{r['subresource']}" if r["subresource"] else "")
    where = f" in {r['namespace']}" if r["namespace"] else ""
    name = f" {r['name']}" if r["name"] else ""
    fs = f" ({r['fieldSelector']})" if r["fieldSelector"] else ""
    return f"{r['verb']} {r['group'] or 'core'}/{res}{name}{where}{fs}"


class Rbac:
    """The rendered RBAC, evaluated as Kubernetes' RBAC authorizer does for ServiceAccounts."""

    def __init__(self, docs):
        roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
                 for d in docs if d["kind"] in ("ClusterRole", "Role")}
        self.grants = []  # (user, namespace or None for cluster-wide, rules)
        for b in docs:
            if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
                continue
            ref = b["roleRef"]
            # A RoleBinding grants in its namespace only (a ClusterRole's rules too).
            ns = b["metadata"]["namespace"] if b["kind"] == "RoleBinding" else None
            role_ns = ns if ref["kind"] == "Role" else ""
            role = roles.get((ref["kind"], role_ns, ref["name"]))
            if role is None:
                raise Failure(f"{b['kind']} {b['metadata']['name']} refers to a missing {ref}")
            for s in b["subjects"]:
                user = f"system:serviceaccount:{s['namespace']}:{s['name']}"
                self.grants.append((user, ns, role.get("rules", [])))

    # What Kubernetes' bootstrap roles grant every authenticated user (system:basic-user,
    # system:discovery; https://kubernetes.io/docs/reference/access-authn-authz/rbac/#default-roles-and-role-bindings):
    # asking what one may do, and discovery, which this server records as a resource-less read.
    EVERYONE = [{"apiGroups": ["authorization.k8s.io"],
                 "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                 "verbs": ["create"]}]

    def allows(self, user, r):
        if not r["resource"] and r["verb"] in ("get", "list"):
            return True  # /api, /apis: system:discovery
        resource = r["resource"] + (f"/{r['subresource']}" if r["subresource"] else "")
        name = r["name"]
        if r["verb"] in ("list", "watch") and r["fieldSelector"].startswith("metadata.name="):
            name = r["fieldSelector"].split("=", 1)[1].split(",")[0]
        for who, ns, rules in [*self.grants, (user, None, self.EVERYONE)]:
            if who != user or (ns is not None and ns != r["namespace"]):
                continue
            for rule in rules:
                if (r["group"] in rule.get("apiGroups", []) and resource in rule.get("resources", [])
                        and r["verb"] in rule.get("verbs", [])):
                    names = rule.get("resourceNames")
                    if not names or (r["verb"] != "create" and name in names):
                        return True
        return False
