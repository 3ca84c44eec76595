#!/usr/bin/env bash
# The CustomResourceDefinitions of the IPAMs `allotctl migrate` carries clusters over from, and
# of OpenKruise's workloads (auto-pools follow any kind with a scale subresource), at pinned
# releases, taken from their published sources through the Go module proxy (a module's
# zip holds the repository's files): the real-cluster tests apply them and write objects shaped
# as those IPAMs write them. Each release is cached outside the clone, keyed by version, and
# linked into target/peer-crds/<name>; nothing is downloaded at test time, nothing is committed.
#
#   scripts/fetch-peer-crds.sh            fetch what is missing; link target/peer-crds/<name>
#   scripts/fetch-peer-crds.sh --print    the cache directory of each, one per line
#
# The cache is $ALLOT_PEERS_CACHE, else $XDG_CACHE_HOME/allot/peers, else ~/.cache/allot/peers.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${ALLOT_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/allot/peers}"
LINKS="$ROOT/target/peer-crds"

# name  module  version  go.sum hash of the module zip  files (paths inside the module)
# Spiderpool's releases are not in Go's checksum database (sum.golang.org answers 404), so the
# hash pinned here is the only check: the download is refused unless it matches. The same holds
# for Calico's: its release tags are not versions of its module path, so v3.31.0 is named by the
# pseudo-version of its tagged commit (as tools/calico/go.mod does), which the checksum database
# does not know either. Its CRDs are those calico-ipam uses with the Kubernetes datastore.
PEERS=(
    "spiderpool github.com/spidernet-io/spiderpool v1.2.2 h1:WiBgOlMb5OwK91j62XaDPaANqiPnKdGpFe54ugBThA4= charts/spiderpool/crds/spiderpool.spidernet.io_spiderippools.yaml charts/spiderpool/crds/spiderpool.spidernet.io_spidersubnets.yaml charts/spiderpool/crds/spiderpool.spidernet.io_spiderreservedips.yaml charts/spiderpool/crds/spiderpool.spidernet.io_spiderendpoints.yaml"
    "whereabouts github.com/k8snetworkplumbingwg/whereabouts v0.9.2 h1:M/LhO2FwXN4C3WPkD0FoT6JACraSW4XrU7mxX9xZd8o= doc/crds/whereabouts.cni.cncf.io_ippools.yaml doc/crds/whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml"
    "kruise github.com/openkruise/kruise v1.8.2 h1:PbIrZJ3ergs3egQpYB4JyqiUko+m9JveuNX3VNSwNcY= config/crd/bases/apps.kruise.io_clonesets.yaml config/crd/bases/apps.kruise.io_statefulsets.yaml"
    "network-attachment-definition github.com/k8snetworkplumbingwg/network-attachment-definition-client v1.7.6 h1:lhSaboKtal0XF2yqSw2BqNB1vUL4+a4BFe39I9G/yiM= artifacts/networks-crd.yaml"
    "calico github.com/projectcalico/calico v0.0.0-20251021213802-b1f3c43f8437 h1:PbLe6D0Yis8ce4F+o/Dmlrv4Her2ZN6ns8rmlZoFoEY= libcalico-go/config/crd/crd.projectcalico.org_ippools.yaml libcalico-go/config/crd/crd.projectcalico.org_ipamblocks.yaml libcalico-go/config/crd/crd.projectcalico.org_blockaffinities.yaml libcalico-go/config/crd/crd.projectcalico.org_ipamhandles.yaml libcalico-go/config/crd/crd.projectcalico.org_ipamconfigs.yaml libcalico-go/config/crd/crd.projectcalico.org_ipreservations.yaml libcalico-go/config/crd/crd.projectcalico.org_clusterinformations.yaml"
)

print_only=false
[ "${1:-}" = "--print" ] && print_only=true

mkdir -p "$LINKS"
for line in "${PEERS[@]}"; do
    read -r name module version sum files <<<"$line"
    # shellcheck disable=SC2206
    files=($files)
    out="$CACHE/$name-$version"
    if $print_only; then
        echo "$out"
        continue
    fi
    if [ ! -f "$out/.complete" ]; then
        echo "setup: fetching $name $version's CRDs ($module) from the Go module proxy into $out"
        work="$(mktemp -d)"
        info="$(cd "$work" && GOFLAGS=-mod=mod GONOSUMDB="$module" go mod download -json "$module@$version")"
        rm -rf "$work"
        got="$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$info")"
        dir="$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$info")"
        if [ "$got" != "$sum" ]; then
            echo "setup: $module@$version has hash ${got:-none}, not the pinned $sum; refusing it" >&2
            sed -n 's/^\t"Error": "\(.*\)",\{0,1\}$/setup: \1/p' <<<"$info" >&2
            exit 1
        fi
        rm -rf "$out.partial"
        mkdir -p "$out.partial"
        for f in "${files[@]}"; do
            install -m 0644 "$dir/$f" "$out.partial/$(basename "$f")"
        done
        echo "$module $version $sum" >"$out.partial/SOURCE"
        touch "$out.partial/.complete"
        rm -rf "$out"
        mv "$out.partial" "$out"
    fi
    ln -sfn "$out" "$LINKS/$name"
done
