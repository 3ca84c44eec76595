#!/usr/bin/env bash
# Builds the upstream binaries the real-cluster tests run, from the Go module proxy at the
# versions pinned in tools/*/go.mod (and go.sum): etcd, kube-apiserver, kube-controller-manager
# and kube-scheduler; the node side (kubelet, kube-proxy, kubectl, containerd with its runc shim and ctr,
# runc, crictl, Multus's thin CNI plugin, and the pause binary compiled from the C source the
# pinned Kubernetes module carries); with --peers also the peer IPAMs the benchmark compares
# allot with (Whereabouts' CNI plugin and ip-control-loop, Calico's CNI plugin and calico-ipam),
# which the tests do not need. Most are pure Go (CGO_ENABLED=0); runc needs cgo and links
# libseccomp statically (Debian's libseccomp-dev), pause needs gcc and a static libc. Each build
# is cached outside the clone, keyed by what it was built from (the module files and the Go
# version; for the C parts also the compiler and the static libraries), so a second run, or
# another clone, takes a second.
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
    "kubernetes tools/controlplane v1.37.2 k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl"
    "containerd tools/containerd v2.4.2 github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr"
    "runc tools/runc v1.5.3 github.com/opencontainers/runc"
    "crictl tools/cri-tools v1.37.0 sigs.k8s.io/cri-tools/cmd/crictl"
    "multus tools/multus v4.2.3 gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/thin_entrypoint gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/install_multus gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/passthru-cni"
    # Not Go: the pause binary, from build/pause/linux/pause.c in the k8s.io/kubernetes module
    # pinned by tools/controlplane (see build_pause); its version is the Makefile's TAG there.
    "pause tools/controlplane 3.10.2 pause"
)
# The peer IPAMs, built only with --peers (the benchmark needs them, the tests do not). Whereabouts
# v0.9.2 has no ip-reconciler binary any more: ip-control-loop runs the reconciler on a cron
# schedule. Calico's one binary is calico-ipam when called by that name (see extra_names_of).
PEERS=(
    "whereabouts tools/whereabouts v0.9.2 github.com/k8snetworkplumbingwg/whereabouts/cmd github.com/k8snetworkplumbingwg/whereabouts/cmd/controlloop github.com/k8snetworkplumbingwg/whereabouts/cmd/nodeslicecontroller"
    "calico tools/calico v3.31.0 github.com/projectcalico/calico/cni-plugin/cmd/calico"
)

# The cache key of a build: what it is built from (the module files, the Go version, the
# packages it builds and the files it ships, and for C parts the compiler and static libraries).
key_of() {
    local name="$1" dir="$2" packages="$3"
    { cat "$ROOT/$dir/go.mod" "$ROOT/$dir/go.sum" 2>/dev/null; go env GOVERSION; echo "$packages"
      extra_key_of "$name"; extra_files_of "$name"; } | sha256sum | cut -c1-12
}

# What else a build depends on, for the components that compile C: the C compiler and the
# static libraries they link (nothing for pure Go ones, so their keys stay as they were).
extra_key_of() {
    local lib
    case "$1" in
        runc) lib=libseccomp.a ;;
        pause) lib=libc.a ;;
        *) return 0 ;;
    esac
    gcc --version 2>/dev/null | head -1
    sha256sum "$(gcc -print-file-name="$lib" 2>/dev/null)" 2>/dev/null || echo "no $lib"
}

# Refuses early, with the package to install, when a C component's static library is missing.
check_c_deps() {
    local lib package
    case "$1" in
        runc) lib=libseccomp.a package=libseccomp-dev ;;
        pause) lib=libc.a package=libc6-dev ;;
        *) return 0 ;;
    esac
    if ! command -v gcc >/dev/null 2>&1 || [ ! -f "$(gcc -print-file-name="$lib")" ]; then
        echo "setup: building $1 needs gcc and $lib (Debian: apt-get install gcc $package)" >&2
        exit 1
    fi
}

# cgo is off (static binaries) except for runc: its nsenter is C and its seccomp support links
# libseccomp, statically here (libseccomp.a from Debian's libseccomp-dev).
cgo_of() {
    case "$1" in
        runc) echo 1 ;;
        *) echo 0 ;;
    esac
}

# Build tags, as the projects' Makefiles set them. containerd: no_btrfs/no_devmapper/no_zfs
# leave out the snapshotters the tests do not use (btrfs is cgo and needs btrfs headers;
# overlayfs and native stay); urfave_cli_no_docs drops man-page generation. Its shim takes
# no_grpc as upstream builds it (the shim serves ttrpc only). runc: seccomp, and not libpathrs
# (a Rust library no distribution here packages; runc then uses its pure-Go path-safety code);
# netgo/osusergo as in runc's `make static`.
tags_of() {
    local name="$1" package="$2"
    case "$name" in
        containerd)
            local tags="urfave_cli_no_docs no_btrfs no_devmapper no_zfs"
            case "$package" in
                */containerd-shim-runc-v2) tags="$tags no_grpc" ;;
            esac
            echo "$tags"
            ;;
        runc) echo "seccomp urfave_cli_no_docs netgo osusergo" ;;
    esac
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
        containerd)
            local pkg=github.com/containerd/containerd/v2/version
            echo "-s -w -X $pkg.Version=$version -X $pkg.Package=github.com/containerd/containerd/v2"
            ;;
        # runc embeds its VERSION file; its C parts are linked statically.
        runc) echo "-s -w -extldflags -static" ;;
        crictl) echo "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=${version#v}" ;;
        multus)
            local pkg=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus
            echo "-s -w -X $pkg.version=$version -X $pkg.gitTreeState=clean -X $pkg.releaseStatus=released"
            ;;
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
        github.com/opencontainers/runc) echo runc ;;
        github.com/k8snetworkplumbingwg/whereabouts/cmd) echo whereabouts ;;
        github.com/k8snetworkplumbingwg/whereabouts/cmd/controlloop) echo ip-control-loop ;;
        github.com/k8snetworkplumbingwg/whereabouts/cmd/nodeslicecontroller) echo node-slice-controller ;;
        # Multus's install_multus copies it by the name its hack/build-go.sh gives it.
        */multus-cni.v4/cmd/passthru-cni) echo passthru ;;
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

# Files of a module a component ships beside its binaries, "module-path=name" pairs: Multus's
# own DaemonSet manifest (the thin plugin's), which the tests install Multus with.
extra_files_of() {
    case "$1" in
        multus) echo "deployments/multus-daemonset.yml=multus-daemonset.yml" ;;
    esac
}

# The pause binary every pod sandbox runs: Kubernetes' build/pause/linux/pause.c, from the
# k8s.io/kubernetes module tools/controlplane pins, compiled as its Makefile does (static, -Os).
build_pause() {
    local version="$1" dest="$2" src
    src="$(cd "$ROOT/tools/controlplane" && go mod download -json k8s.io/kubernetes \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')/build/pause/linux/pause.c"
    [ -f "$src" ] || { echo "setup: $src is missing" >&2; exit 1; }
    gcc -Os -Wall -Werror -static -DVERSION="v$version" -o "$dest/pause" "$src"
    strip "$dest/pause"
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
    out="$CACHE/$name-$version-$(key_of "$name" "$dir" "${packages[*]}")"
    if $print_only; then
        echo "$out"
        continue
    fi
    if [ ! -f "$out/.complete" ]; then
        echo "setup: building $name $version from the Go module proxy into $out (cached; minutes the first time)"
        check_c_deps "$name"
        rm -rf "$out.partial"
        mkdir -p "$out.partial"
        if [ "$name" = pause ]; then
            build_pause "$version" "$out.partial"
        else
            # One `go build` per package: their build tags may differ (containerd's shim). The
            # packages they share are compiled once (Go's build cache).
            for package in "${packages[@]}"; do
                (
                    cd "$ROOT/$dir"
                    CGO_ENABLED="$(cgo_of "$name")" go build -mod=mod -trimpath \
                        -tags "$(tags_of "$name" "$package")" \
                        -ldflags "$(ldflags_of "$name" "$version")" -o "$out.partial/" "$package"
                )
                built="$out.partial/$(go_binary_name "$package")"
                want="$out.partial/$(binary_of "$package")"
                [ "$built" = "$want" ] || mv "$built" "$want"
            done
        fi
        for pair in $(extra_names_of "$name"); do
            ln "$out.partial/${pair#*=}" "$out.partial/${pair%%=*}"
        done
        for pair in $(extra_files_of "$name"); do
            # The module is the path of its first package up to /cmd/.
            moddir="$(cd "$ROOT/$dir" && go mod download -json "${packages[0]%%/cmd/*}" \
                | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
            install -m 0644 "$moddir/${pair%%=*}" "$out.partial/${pair#*=}"
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
    for pair in $(extra_files_of "$name"); do
        ln -sfn "$out/${pair#*=}" "$TOOLS/${pair#*=}"
    done
done
