#!/usr/bin/env bash
# Builds the upstream binaries the real-cluster tests run, from the Go module proxy at the
# versions pinned in tools/*/go.mod (and go.sum): etcd, kube-apiserver, kube-controller-manager
# and kube-scheduler; with --peers also the peer IPAMs the benchmark compares allot with
# (Whereabouts' CNI plugin and ip-control-loop, Calico's CNI plugin and calico-ipam), which the
# tests do not need. Each build is cached outside the clone, keyed by what it was built from
# (the module files and the Go version), so a second run, or another clone, takes a second.
#
#   scripts/build-upstream.sh            build what is missing; link target/tools/<binary>
#   scripts/build-upstream.sh --peers    the same, and the peer IPAMs too
#   scripts/build-upstream.sh --print    the cache directory of each component (peers included)
#
# The cache is $ALLOT_TOOLS_CACHE, else $XDG_CACHE_HOME/allot/tools, else ~/.cache/allot/tools;
# Go's own module and build caches (GOMODCACHE, GOCACHE) stay where Go keeps them, outside the
# clone too. Nothing is downloaded at test time.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${ALLOT_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/allot/tools}"
TOOLS="$ROOT/target/tools"

# component  module-dir  version  packages (binary name = last path element)
COMPONENTS=(
    "etcd tools/etcd v3.6.16 go.etcd.io/etcd/server/v3"
    "kubernetes tools/controlplane v1.35.4 k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler"
)
# The peer IPAMs, built only with --peers (the benchmark needs them, the tests do not). Whereabouts
# v0.9.2 has no ip-reconciler binary any more: ip-control-loop runs the reconciler on a cron
# schedule. Calico's one binary is calico-ipam when called by that name (see extra_names_of).
PEERS=(
    "whereabouts tools/whereabouts v0.9.2 github.com/k8snetworkplumbingwg/whereabouts/cmd github.com/k8snetworkplumbingwg/whereabouts/cmd/controlloop github.com/k8snetworkplumbingwg/whereabouts/cmd/nodeslicecontroller"
    "calico tools/calico v3.31.0 github.com/projectcalico/calico/cni-plugin/cmd/calico"
)

key_of() {
    local dir="$1"
    { cat "$ROOT/$dir/go.mod" "$ROOT/$dir/go.sum" 2>/dev/null; go env GOVERSION; } \
        | sha256sum | cut -c1-12
}

ldflags_of() {
    local name="$1" version="$2"
    case "$name" in
        kubernetes)
            local minor="${version#v1.}"
            minor="${minor%%.*}"
            local pkg=k8s.io/component-base/version
            echo "-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor" \
                "-X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z" \
                "-X k8s.io/client-go/pkg/version.gitVersion=$version"
            ;;
        etcd) echo "-s -w" ;;
        whereabouts)
            local pkg=github.com/k8snetworkplumbingwg/whereabouts/pkg/version
            echo "-s -w -X $pkg.Version=$version -X $pkg.ReleaseStatus=released"
            ;;
        calico) echo "-s -w -X github.com/projectcalico/calico/pkg/buildinfo.Version=$version" ;;
    esac
}

binary_of() {
    local package="$1"
    case "$package" in
        go.etcd.io/etcd/server/v3) echo etcd ;;
        github.com/k8snetworkplumbingwg/whereabouts/cmd) echo whereabouts ;;
        github.com/k8snetworkplumbingwg/whereabouts/cmd/controlloop) echo ip-control-loop ;;
        github.com/k8snetworkplumbingwg/whereabouts/cmd/nodeslicecontroller) echo node-slice-controller ;;
        *) basename "$package" ;;
    esac
}

# Further names of a built binary (hard links beside it), for binaries that act by the name they
# are called by: "name=binary" pairs. Calico's plugin is its IPAM plugin when called calico-ipam.
extra_names_of() {
    case "$1" in
        calico) echo "calico-ipam=calico" ;;
    esac
}

# The name `go build -o DIR/` gives a main package's binary: its last path element, or the one
# before a major version suffix (`…/server/v3` → `server`).
go_binary_name() {
    local last prev
    last="$(basename "$1")"
    prev="$(basename "$(dirname "$1")")"
    if [[ "$last" =~ ^v[0-9]+$ ]]; then echo "$prev"; else echo "$last"; fi
}

print_only=false
peers=false
for arg in "$@"; do
    case "$arg" in
        --print) print_only=true ;;
        --peers) peers=true ;;
        *) echo "usage: $0 [--peers] [--print]" >&2; exit 2 ;;
    esac
done
wanted=("${COMPONENTS[@]}")
if $peers || $print_only; then wanted+=("${PEERS[@]}"); fi

mkdir -p "$TOOLS"
for line in "${wanted[@]}"; do
    read -r name dir version packages <<<"$line"
    # shellcheck disable=SC2206
    packages=($packages)
    out="$CACHE/$name-$version-$(key_of "$dir")"
    if $print_only; then
        echo "$out"
        continue
    fi
    if [ ! -f "$out/.complete" ]; then
        echo "setup: building $name $version from the Go module proxy into $out (cached; minutes the first time)"
        rm -rf "$out.partial"
        mkdir -p "$out.partial"
        (
            cd "$ROOT/$dir"
            CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "$(ldflags_of "$name" "$version")" \
                -o "$out.partial/" "${packages[@]}"
        )
        for package in "${packages[@]}"; do
            built="$out.partial/$(go_binary_name "$package")"
            want="$out.partial/$(binary_of "$package")"
            [ "$built" = "$want" ] || mv "$built" "$want"
        done
        for pair in $(extra_names_of "$name"); do
            ln "$out.partial/${pair#*=}" "$out.partial/${pair%%=*}"
        done
        touch "$out.partial/.complete"
        rm -rf "$out"
        mv "$out.partial" "$out"
    fi
    for package in "${packages[@]}"; do
        ln -sfn "$out/$(binary_of "$package")" "$TOOLS/$(binary_of "$package")"
    done
    for pair in $(extra_names_of "$name"); do
        ln -sfn "$out/${pair%%=*}" "$TOOLS/${pair%%=*}"
    done
done
