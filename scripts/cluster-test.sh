#!/usr/bin/env bash
# The real-cluster suite (`make cluster-test`, part of `make test`): allot on the local lab, a
# real upstream control plane (tests/lab). Two phases, one lab on the machine at a time:
#
#  1. one lab of three nodes for the whole phase: the tests of tests/cluster (but lifecycle)
#     attach to it (ALLOT_LAB_CLUSTER), the first installs allot with the README's helm
#     install, each works in a namespace and with pools of its own, one after another;
#  2. the tests that take an installation down (upgrade, the uninstall sequences) and the
#     Kubernetes store's contract suite, each on a lab of its own.
#
# Builds come first (make cluster-test depends on build and policies). Logs of a failed run
# stay in $TARGET/lab-suite (the lab's components, nodes, pods).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
LAB="$TARGET/release/allot-lab-cluster"
DIR="$TARGET/lab-suite"
CARGO="${CARGO:-cargo}"
# --workspace: the test binaries `make unit` built (one feature set for the workspace), not a
# second build of the crates this package shares with the others.
NEXTEST=("$CARGO" nextest run --release --locked --no-fail-fast --workspace)
# The test modules that start labs of their own (Suite::own): they cannot run while the shared
# lab is up, whose bridge and lock they would wait for.
OWN_LAB='test(/^(lifecycle|audit|migration|multus)::/)'

if [ "$(id -u)" -ne 0 ]; then
    echo "cluster-test: the lab makes network namespaces and mounts: run as root" >&2
    exit 1
fi
[ -x "$LAB" ] || { echo "cluster-test: $LAB is missing: run make build" >&2; exit 1; }

# Phase 1: the shared lab.
rm -rf "$DIR" "$DIR.out"
"$LAB" up --nodes 3 --dir "$DIR" --keep --node-monitor-grace-seconds 20 >"$DIR.out" 2>"$DIR.err" &
lab=$!
stop_lab() {
    if kill -0 "$lab" 2>/dev/null; then
        kill -INT "$lab"
        wait "$lab" || true
    fi
}
trap stop_lab EXIT
for _ in $(seq 1 300); do
    grep -q '^KUBECONFIG=' "$DIR.out" 2>/dev/null && break
    if ! kill -0 "$lab" 2>/dev/null; then
        echo "cluster-test: the lab did not start:" >&2
        tail -n 30 "$DIR.err" >&2
        exit 1
    fi
    sleep 1
done
grep -q '^KUBECONFIG=' "$DIR.out" || { echo "cluster-test: the lab did not start within 300 s" >&2; exit 1; }
export ALLOT_LAB_CLUSTER="$DIR/cluster.json"
started=$(date +%s)
status=0
"${NEXTEST[@]}" --test-threads 1 -E "package(allot-cluster-tests) & not ($OWN_LAB)" || status=$?
echo "cluster-test: the shared phase took $(( $(date +%s) - started )) s"
stop_lab
trap - EXIT
unset ALLOT_LAB_CLUSTER

# Phase 2: tests with labs of their own (the lab's lock runs them one after another).
started=$(date +%s)
"${NEXTEST[@]}" -E "package(allot-cluster-tests) & ($OWN_LAB)" || status=$?
echo "cluster-test: the own-lab phase took $(( $(date +%s) - started )) s"
if [ "$status" -eq 0 ]; then
    rm -rf "$DIR" "$DIR.out" "$DIR.err"
fi
exit "$status"
