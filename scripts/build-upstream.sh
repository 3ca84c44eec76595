#!/usr/bin/env bash
# Builds the upstream binaries the real-cluster tests run, from the Go module proxy at the
# versions pinned in tools/*/go.mod (and go.sum): etcd, kube-apiserver, kube-controller-manager
# and kube-scheduler. Each build is cached outside the clone, keyed by what it was built from
# (the module files and the Go version), so a second run, or another clone, takes a second.
#
#   scripts/build-upstream.sh            build what is missing; link target/tools/<binary>
#   scripts/build-upstream.sh --print    the cache directory of each component, one per line
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
    esac
}

binary_of() {
    local package="$1"
    case "$package" in
        go.etcd.io/etcd/server/v3) echo etcd ;;
        *) basename "$package" ;;
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
[ "${1:-}" = "--print" ] && print_only=true

mkdir -p "$TOOLS"
for line in "${COMPONENTS[@]}"; do
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
        touch "$out.partial/.complete"
        rm -rf "$out"
        mv "$out.partial" "$out"
    fi
    for package in "${packages[@]}"; do
        ln -sfn "$out/$(binary_of "$package")" "$TOOLS/$(binary_of "$package")"
    done
done
