#!/usr/bin/env python3
"""Offline schema check of what users apply to a cluster (no API server can run here).

1. Every CRD in crds/ is a valid CustomResourceDefinition (kubernetes-validate, --strict).
2. Every object in examples/kubernetes/ passes its CRD's openAPIV3Schema, read as the API server
   reads it (nullable, unknown fields refused as kubectl's strict field validation does).
3. The check can fail: known-bad objects must be refused.
"""
import copy
import glob
import subprocess
import sys
import tempfile

import jsonschema
import yaml

ROOT = __file__.rsplit("/scripts/", 1)[0]


def load_all(pattern):
    for path in sorted(glob.glob(f"{ROOT}/{pattern}")):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    yield path, doc


def as_json_schema(schema):
    """openAPIV3Schema -> JSON Schema: `nullable` admits null; objects with listed properties
    refuse others (the API server would silently prune them: a typo must fail here)."""
    s = copy.deepcopy(schema)

    def walk(node, top=False):
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
            if node.get("nullable"):
                t = node.get("type")
                if isinstance(t, str):
                    node["type"] = [t, "null"]
                if "enum" in node:
                    node["enum"] = node["enum"] + [None]
            if "properties" in node and "additionalProperties" not in node and not top:
                if not node.get("x-kubernetes-preserve-unknown-fields"):
                    node["additionalProperties"] = False
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(s, top=True)
    # metadata is checked by the API server itself.
    s.setdefault("properties", {})["metadata"] = {"type": "object"}
    return s


def validators():
    out = {}
    for path, crd in load_all("crds/*.yaml"):
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = as_json_schema(version["schema"]["openAPIV3Schema"])
            out[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(schema)
    return out


def errors_of(validator, obj):
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in validator.iter_errors(obj)
    ]


def main():
    crds = sorted(glob.glob(f"{ROOT}/crds/*.yaml"))
    subprocess.run(["kubernetes-validate", "--strict", "--quiet", *crds], check=True)
    print(f"check-k8s-schemas: {len(crds)} CRDs are valid CustomResourceDefinitions")

    by_kind = validators()
    failed = False
    checked = 0
    builtin = []
    for path, obj in load_all("examples/kubernetes/*.yaml"):
        key = (obj.get("apiVersion"), obj.get("kind"))
        if not obj.get("apiVersion", "").startswith("allot.dev/"):
            # Kubernetes' own kinds (workloads asking for auto pools): its bundled schemas.
            builtin.append(obj)
            continue
        validator = by_kind.get(key)
        if validator is None:
            print(f"{path}: no CRD for {key}", file=sys.stderr)
            failed = True
            continue
        for e in errors_of(validator, obj):
            print(f"{path}: {obj['kind']} {obj['metadata'].get('name')}: {e}", file=sys.stderr)
            failed = True
        checked += 1
    print(f"check-k8s-schemas: {checked} sample objects checked against their CRDs")
    if builtin:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump_all(builtin, f)
            f.flush()
            if subprocess.run(["kubernetes-validate", "--strict", "--quiet", f.name]).returncode:
                print("check-k8s-schemas: a sample workload fails Kubernetes' schema",
                      file=sys.stderr)
                failed = True
        print(f"check-k8s-schemas: {len(builtin)} sample workloads checked (kubernetes-validate)")

    pool = by_kind[("allot.dev/v1alpha1", "IPPool")]
    good = {"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool",
            "metadata": {"name": "p"}, "spec": {"subnet": "10.0.0.0/24"}}
    assert not errors_of(pool, good), errors_of(pool, good)
    for field, value in [("subnet", "ten-dot-zero"), ("ipVersion", 5), ("ips", ["10.0.0.1 - 2"]),
                         ("nodename", ["a"])]:
        bad = copy.deepcopy(good)
        bad["spec"][field] = value
        if not errors_of(pool, bad):
            print(f"check-k8s-schemas: an IPPool with {field}={value!r} passed", file=sys.stderr)
            failed = True

    ipampool = by_kind[("allot.dev/v1alpha1", "IPAMPool")]
    good = {"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMPool", "metadata": {"name": "lb"},
            "spec": {"datacenters": {"dc1": {"type": "range", "poolCidr": "10.0.0.0/16",
                                             "allocationRange": 10}}}}
    assert not errors_of(ipampool, good), errors_of(ipampool, good)
    for field, value in [("type", "block"), ("poolCidr", "10.0.0.0"), ("allocationRange", 0),
                         ("allocationPrefix", 129), ("excludeRanges", ["10.0.0.1 - 2"]),
                         ("allocationRnage", 4)]:
        bad = copy.deepcopy(good)
        bad["spec"]["datacenters"]["dc1"][field] = value
        if not errors_of(ipampool, bad):
            print(f"check-k8s-schemas: an IPAMPool with {field}={value!r} passed", file=sys.stderr)
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
