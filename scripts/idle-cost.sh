#!/usr/bin/env bash
# What an idle agent costs: starts each given allot-agent binary in standalone mode on
# examples/standalone, lets it settle, then reads its CPU time (utime+stime, all threads) and
# context switches (voluntary+nonvoluntary, summed over /proc/PID/task/*/status) at the start
# and the end of an idle window. The agents run side by side, so they see the same machine.
#
#   scripts/idle-cost.sh [-s SECONDS] BINARY...     e.g. scripts/idle-cost.sh -s 60 old/allot-agent target/release/allot-agent
set -euo pipefail

seconds=60
if [ "${1:-}" = "-s" ]; then
    seconds=$2
    shift 2
fi
[ $# -gt 0 ] || { echo "usage: $0 [-s SECONDS] ALLOT_AGENT_BINARY..." >&2; exit 2; }

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

ticks_per_s=$(getconf CLK_TCK)

# utime+stime of the whole process, in clock ticks (fields 14 and 15 after the command name).
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }

switches() {
    cat /proc/"$1"/task/*/status 2>/dev/null |
        awk '/^(voluntary|nonvoluntary)_ctxt_switches:/ {n += $2} END {print n}'
}

bins=("$@")
for i in "${!bins[@]}"; do
    bin=${bins[$i]}
    "$bin" --standalone "$root/examples/standalone" --socket "$work/$i.sock" \
        --state "$work/$i.db" >"$work/$i.log" 2>&1 &
    pids+=($!)
done
# Start-up (policy compile, first reload) is not idle time.
sleep 5
declare -A cpu0 sw0
for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo "agent $pid exited; its log:" >&2; cat "$work"/*.log >&2; exit 1; }
    cpu0[$pid]=$(cpu_ticks "$pid")
    sw0[$pid]=$(switches "$pid")
done
sleep "$seconds"
printf '%-40s %12s %10s %16s %12s\n' binary cpu_seconds cpu_% context_switches per_second
for i in "${!pids[@]}"; do
    pid=${pids[$i]}
    cpu=$(( $(cpu_ticks "$pid") - ${cpu0[$pid]} ))
    sw=$(( $(switches "$pid") - ${sw0[$pid]} ))
    awk -v b="${bins[$i]}" -v c="$cpu" -v t="$ticks_per_s" -v s="$seconds" -v w="$sw" \
        'BEGIN {printf "%-40s %12.2f %10.2f %16d %12.1f\n", b, c / t, 100 * c / t / s, w, w / s}'
done
