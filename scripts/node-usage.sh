#!/usr/bin/env bash
# Memory and CPU of each real node of a running lab (`allot-lab-cluster up --dir DIR --keep`),
# over an interval: the node's own processes (containerd, its shims, the kubelet, kube-proxy:
# every process in the node's mount namespace) and its pods (the memory and cpuacct cgroups
# under the node's cgroup root, /allot-lab-<node>). What docs/benchmarks.md reports per node.
#
#   scripts/node-usage.sh [SECONDS]      (default 60; run as root)
set -euo pipefail
interval="${1:-60}"
clk=$(getconf CLK_TCK)
mem_root=/sys/fs/cgroup/memory
cpu_root=/sys/fs/cgroup/cpuacct

# The pids sharing the mount namespace of the node's kubelet.
node_pids() {
    local kubelet ns pid
    kubelet=$(pgrep -f "kubelet .*--hostname-override=$1( |$)" | head -n 1) || return 0
    ns=$(readlink "/proc/$kubelet/ns/mnt")
    for pid in /proc/[0-9]*; do
        if [ "$(readlink "$pid/ns/mnt" 2>/dev/null)" = "$ns" ]; then echo "${pid#/proc/}"; fi
    done
}

# CPU ticks (user + system) of the given pids.
ticks() {
    local total=0 pid stat fields
    for pid in "$@"; do
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
        # The fields after the command name: utime and stime are the 12th and 13th of them.
        read -r -a fields <<<"${stat##*) }"
        total=$((total + fields[11] + fields[12]))
    done
    echo "$total"
}

rss_kib() {
    local total=0 pid kib
    for pid in "$@"; do
        kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || continue
        total=$((total + ${kib:-0}))
    done
    echo "$total"
}

nodes=$(pgrep -af 'kubelet .*--hostname-override=' | sed -E 's/.*--hostname-override=([^ ]+).*/\1/' | sort -u)
[ -n "$nodes" ] || { echo "node-usage: no real lab node runs here" >&2; exit 1; }
declare -A pids0 ticks0 pods0
for node in $nodes; do
    pids0[$node]="$(node_pids "$node" | tr '\n' ' ')"
    # shellcheck disable=SC2086
    ticks0[$node]=$(ticks ${pids0[$node]})
    pods0[$node]=$(cat "$cpu_root/allot-lab-$node/cpuacct.usage" 2>/dev/null || echo 0)
done
sleep "$interval"
printf '%-8s %14s %14s %16s %16s\n' node daemons-MiB pods-MiB daemons-cpu-% pods-cpu-%
for node in $nodes; do
    # shellcheck disable=SC2086
    t1=$(ticks ${pids0[$node]})
    p1=$(cat "$cpu_root/allot-lab-$node/cpuacct.usage" 2>/dev/null || echo 0)
    # shellcheck disable=SC2046
    rss=$(rss_kib $(node_pids "$node"))
    pods=$(cat "$mem_root/allot-lab-$node/memory.usage_in_bytes" 2>/dev/null || echo 0)
    awk -v n="$node" -v rss="$rss" -v pods="$pods" -v dt="$((t1 - ticks0[$node]))" \
        -v dp="$((p1 - pods0[$node]))" -v clk="$clk" -v s="$interval" 'BEGIN {
        printf "%-8s %14.0f %14.0f %16.2f %16.2f\n", n, rss / 1024, pods / 1048576,
            100 * dt / clk / s, 100 * dp / 1e9 / s }'
done
