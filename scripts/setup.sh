#!/usr/bin/env bash
# Installs what building and testing allot needs on a fresh machine; quick when all is there.
set -euo pipefail

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
    echo "setup: installing the wasm32-wasip2 Rust target (policies are WebAssembly components)"
    rustup target add wasm32-wasip2
fi

if ! cargo nextest --version >/dev/null 2>&1; then
    echo "setup: installing cargo-nextest"
    cargo install --locked cargo-nextest
fi

# Debian packages the tests use. Each line: the command that proves it is installed, the package.
missing=()
while read -r probe package; do
    [ -z "$probe" ] && continue
    if ! command -v "$probe" >/dev/null 2>&1 && [ ! -e "$probe" ]; then
        missing+=("$package")
    fi
done <<'PACKAGES'
/usr/lib/cni/bridge containernetworking-plugins
ip iproute2
ping iputils-ping
arping iputils-arping
ndisc6 ndisc6
etcd etcd-server
docker-registry docker-registry
openssl openssl
etcdctl etcd-client
protoc protobuf-compiler
/usr/include/google/protobuf/descriptor.proto libprotobuf-dev
PACKAGES
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    sudo_cmd=()
    [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}"
fi

# The offline schema check of crds/ and examples/kubernetes/ (no API server runs here).
if ! command -v kubernetes-validate >/dev/null 2>&1; then
    echo "setup: installing kubernetes-validate (PyPI) for the offline CRD schema check"
    python3 -m pip install --quiet kubernetes-validate \
        || python3 -m pip install --quiet --break-system-packages kubernetes-validate
fi
