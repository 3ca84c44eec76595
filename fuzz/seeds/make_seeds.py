#!/usr/bin/env python3
"""Writes the hand-made seed inputs of every fuzz target into fuzz/corpus/<target>/seed-*.

The committed corpora are these seeds plus what the campaigns found, minimised with afl-cmin;
re-running this script only restores the seeds. Seeds are named for what they exercise."""
import json
import os
import random

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


# cni_config: NAME=VALUE lines, a blank line, the network config.
def cni(command, conf, container="c1", ifname="eth0", netns="/var/run/netns/p",
        args="K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod;K8S_POD_UID=u1"):
    env = [f"CNI_COMMAND={command}"]
    for k, v in [("CNI_CONTAINERID", container), ("CNI_IFNAME", ifname),
                 ("CNI_NETNS", netns), ("CNI_ARGS", args), ("CNI_PATH", "/opt/cni/bin")]:
        if v is not None:
            env.append(f"{k}={v}")
    body = conf if isinstance(conf, str) else json.dumps(conf)
    return "\n".join(env) + "\n\n" + body


IPAM = {"type": "allot", "socket": "/run/allot/agent.sock",
        "default_ipv4_ippool": ["p1", "p2"], "default_ipv6_ippool": ["p6"], "timeout_ms": 1500}
BASE = {"cniVersion": "1.1.0", "name": "net1", "type": "macvlan", "master": "eth0", "ipam": IPAM}

write("cni_config", "add", cni("ADD", BASE))
write("cni_config", "add-owner-ignore-unknown",
      cni("ADD", dict(BASE, cniVersion="0.3.1"),
          args="IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=db-0;ALLOT_OWNER=StatefulSet/db;X=y"))
write("cni_config", "add-no-pod", cni("ADD", BASE, args=None))
write("cni_config", "del-unknown-ipam-field",
      cni("DEL", dict(BASE, ipam={"type": "allot", "defualt": 1}), netns=None))
write("cni_config", "check-prev-result",
      cni("CHECK", dict(BASE, cniVersion="1.0.0",
                        prevResult={"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.5/24"},
                                                                    {"address": "fd00::5/64"}]})))
write("cni_config", "check-too-old", cni("CHECK", dict(BASE, cniVersion="0.3.0")))
write("cni_config", "status", cni("STATUS", {"cniVersion": "1.1.0", "name": "n", "ipam": {"type": "allot"}}))
write("cni_config", "gc", cni("GC", dict(BASE, **{"cni.dev/valid-attachments": [
    {"containerID": "c1", "ifname": "eth0"}, {"containerID": "c2", "ifname": "net1"}]})))
write("cni_config", "gc-old-key", cni("GC", dict(BASE, **{"cni.dev/attachments": None})))
write("cni_config", "version", cni("VERSION", {"cniVersion": "1.1.0"}))
write("cni_config", "bad-env", cni("ADD", BASE, container="-bad/id", ifname="a-very-long-ifname0"))
write("cni_config", "bad-ipam-types",
      cni("ADD", dict(BASE, ipam={"type": 1, "socket": "rel", "timeout_ms": 0,
                                  "default_ipv4_ippool": "p"})))
write("cni_config", "not-json", cni("ADD", "{\"cniVersion\":"))
write("cni_config", "no-command", "CNI_CONTAINERID=c\n\n{}")
write("cni_config", "bad-command-echoes-latest", 'CNI_COMMAND=BOGUS\n\n{"cniVersion":"0.4.0"}')

# annotations: the key, a newline, the value.
ANN = [
    ("ipam.allot.dev/ippool", '{"ipv4":["p1"],"ipv6":["p6a","p6b"]}'),
    ("ipam.spidernet.io/ippools",
     '[{"interface":"eth0","ipv4":["a"],"ipv6":["b"],"cleangateway":true},{"interface":"net1","ipv4":["c"]}]'),
    ("ipam.allot.dev/subnet", '{"ipv4":["s4"],"ipv6":["s6"]}'),
    ("ipam.allot.dev/subnets", '[{"interface":"eth0","ipv4":["s4"]}]'),
    ("ipam.allot.dev/routes", '[{"dst":"10.0.0.0/16","gw":"192.168.1.1"},{"dst":"fd00::/8","gw":"fd00::1"}]'),
    ("ipam.allot.dev/default-ipv4-ippool", '["ns-pool1","ns-pool2"]'),
    ("ipam.spidernet.io/defaultv6ippool", '["ns-pool6"]'),
    ("ipam.allot.dev/ippool", '{"ipv4":["pool-*","p?ol-[a-c]","[!x]*"]}'),
    ("ipam.allot.dev/ippools", '[{"ipv4":["a"]},{"interface":"eth0","ipv4":["b"]}]'),
    ("wildcard", "pool-[a-c]*\npool-b1\npool-d\n[ab\n[]]x"),
    ("wildcard-neg", "*[^0-9]?\nab\na1b\n"),
]
for i, (k, v) in enumerate(ANN):
    write("annotations", f"{i:02}-" + k.rsplit("/", 1)[-1], k + "\n" + v)

# pools: a JSON array of standalone documents.
def obj(kind, name, spec, **meta):
    return {"kind": kind, "metadata": dict(name=name, **meta), "spec": spec}

V4 = obj("IPPool", "demo-v4", {"ipVersion": 4, "subnet": "192.0.2.0/24", "ips": ["192.0.2.10-192.0.2.99"],
                                "excludeIPs": ["192.0.2.13"], "gateway": "192.0.2.1",
                                "routes": [{"dst": "198.51.100.0/24", "gw": "192.0.2.1"}]})
V6 = obj("IPPool", "demo-v6", {"ipVersion": 6, "subnet": "2001:db8:a110::/64", "gateway": "2001:db8:a110::1"})
RES = obj("ReservedIP", "demo-reserved", {"ipVersion": 4, "ips": ["192.0.2.10-192.0.2.11"]})
SUB = obj("Subnet", "sub", {"subnet": "10.6.0.0/16", "ips": ["10.6.0.0/24", "10.6.1.1"], "gateway": "10.6.0.1"})
write("pools", "standalone-example", json.dumps([V4, V6, RES]))
write("pools", "overlaps", json.dumps([
    V4, obj("IPPool", "other", {"subnet": "192.0.2.0/25", "ips": ["192.0.2.50"]}),
    obj("IPPool", "same-subnet", {"subnet": "192.0.2.0/24", "ips": ["192.0.2.99-192.0.2.120"]}),
    obj("IPPool", "demo-v4", {"subnet": "10.0.0.0/8"})]))
write("pools", "subnet-and-labels", json.dumps([SUB, obj("IPPool", "auto", {
    "subnet": "10.6.0.1/16", "ips": ["10.6.0.10-10.6.0.20", "10.6.0.0/30"], "default": True, "disable": False,
    "podAffinity": {"matchLabels": {"app": "x"}}, "nodeName": ["n1"]},
    labels={"ipam.allot.dev/owner-subnet": "sub", "ipam.allot.dev/owner-application-kind": "Deployment",
            "ipam.allot.dev/owner-application-namespace": "ns", "ipam.allot.dev/owner-application-name": "a"},
    deletionTimestamp="2026-01-01T00:00:00Z")]))
write("pools", "ipv6-huge", json.dumps([
    obj("IPPool", "all6", {"subnet": "::/0", "excludeIPs": ["::1", "ffff::-ffff::ffff"]}),
    obj("IPPool", "all4", {"subnet": "0.0.0.0/0", "ips": ["0.0.0.0-255.255.255.255"]}),
    obj("ReservedIP", "r6", {"ips": ["::/1", "8000::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"]})]))
write("pools", "bad-entries", json.dumps([
    obj("IPPool", "bad", {"ipVersion": 6, "subnet": "10.0.0.0/24"}),
    obj("IPPool", "rev", {"subnet": "10.0.0.0/24", "ips": ["10.0.0.9-10.0.0.1"]}),
    obj("IPPool", "mixed", {"subnet": "10.0.0.0/24", "ips": ["fd00::1"]}),
    obj("IPPool", "gw", {"subnet": "10.0.0.0/24", "gateway": "10.0.1.1"}),
    obj("IPPool", "route", {"subnet": "10.0.0.0/24", "routes": [{"dst": "fd00::/8", "gw": "10.0.0.1"}]}),
    obj("ReservedIP", "", {"ips": []}), obj("Subnet", "s", {"subnet": "x"}),
    obj("IPPool", "slash31", {"subnet": "10.9.9.0/31"}), obj("IPPool", "slash127", {"subnet": "fd00::/127"})]))

# wire: HTTP responses as the agent's socket delivers them.
def http(status, body, headers=None, reason="OK"):
    headers = headers if headers is not None else {"Content-Type": "application/json",
                                                    "Content-Length": str(len(body))}
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head + "\r\n" + body

RESULT = json.dumps({"ips": [{"address": "10.6.0.12/24", "gateway": "10.6.0.1", "pool": "p1"},
                             {"address": "fd00::c/64", "pool": "p6"}],
                     "routes": [{"dst": "0.0.0.0/0", "gw": "10.6.0.1"}, {"dst": "fd00:1::/48"}]})
write("wire", "add-result", http(200, RESULT))
write("wire", "chunked", http(200, "", {"Transfer-Encoding": "gzip, chunked"})
      + "%x\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\n" % (len(RESULT), RESULT))
write("wire", "continue-then-eof", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n{}")
write("wire", "no-content", http(204, "", {}))
write("wire", "error-body", http(500, json.dumps({"code": 100, "msg": "no pool fits", "details": "p1: exhausted"}),
                                 reason="Internal Server Error"))
write("wire", "error-code-zero", http(400, '{"code":0,"msg":"x"}'))
write("wire", "status", http(200, json.dumps({"ready": True, "message": "", "pools": [
    {"name": "p1", "ipVersion": 4, "total": 90, "free": 0}, {"name": "p6", "ipVersion": 6, "total": 1 << 63, "free": 5}]})))
write("wire", "gc", http(200, '{"released":["10.6.0.9"]}'))
write("wire", "bare-add-request", json.dumps({"containerId": "c", "ifName": "eth0", "netns": "/n", "network": "n",
                                              "defaultIpv4Pools": ["a"], "pod": {"namespace": "ns", "name": "p",
                                                                                  "ownerKind": "StatefulSet"}}))
write("wire", "bare-gc-request", '{"network":"n","validAttachments":[{"containerId":"c","ifName":"e"}]}')
write("wire", "conflicting-length", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}")
write("wire", "bad-result", http(200, json.dumps({"ips": [{"address": "10.0.0.1/33", "gateway": "fd00::1", "pool": "p"}],
                                                  "routes": [{"dst": "x", "gw": "y"}]})))

# decision: choice bytes (see fuzz/src/decision.rs).
rng = random.Random(6)
for n in [0, 8, 24, 64, 128, 256]:
    write("decision", f"random-{n}", bytes(rng.randrange(256) for _ in range(n)))
write("decision", "four-pools-one-nic", bytes([4, 1, 0, 0, 10, 1, 0, 0, 20, 0, 0, 0, 30, 1, 0, 0, 40,
                                              1, 0, 0, 1, 1, 1, 1, 0, 3, 1, 2, 3, 0, 2, 1, 1, 1]))
