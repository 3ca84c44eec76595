#!/usr/bin/env bash
# Fuzzing allot's parsers with AFL++ (cargo-afl) on the stable toolchain. See fuzz/README.md.
#
#   scripts/fuzz.sh run TARGET [EXECS] [SECONDS]   one campaign: stops after EXECS executions
#                                                 (default 10,000,000) or SECONDS (default 3600)
#   scripts/fuzz.sh minimize TARGET                afl-cmin the campaign's queue into
#                                                 fuzz/corpus/TARGET (hand-made seed-* files stay)
#   scripts/fuzz.sh build                          only build the instrumented harness
#
# Campaign output goes to target/fuzz/TARGET/ (AFL++'s -o); crashes found are copied to
# fuzz/crashes/TARGET/, where `make test` replays them. Installs cargo-afl when it is missing.
# Runs at the lowest CPU priority: fuzzing should never slow down someone's build.
set -euo pipefail
cd "$(dirname "$0")/.."

HARNESS=target/afl/release/allot-fuzz-afl
TARGETS=(cni_config annotations pools wire decision)

usage() {
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}

known_target() {
    local t
    for t in "${TARGETS[@]}"; do
        [ "$t" = "${1:-}" ] && return 0
    done
    echo "fuzz: unknown target '${1:-}'; targets: ${TARGETS[*]}" >&2
    exit 2
}

setup() {
    if ! cargo afl --version >/dev/null 2>&1; then
        echo "fuzz: installing cargo-afl"
        cargo install --locked cargo-afl
    fi
    # cargo-afl builds AFL++ once per toolchain; its help (exit status 1) shows that it did.
    local help
    help=$(cargo afl fuzz -h 2>&1 || true)
    if ! grep -q 'Required parameters' <<<"$help"; then
        cargo afl config --build
    fi
}

build() {
    setup
    nice -n 19 cargo afl build --release --manifest-path fuzz/afl/Cargo.toml --target-dir target/afl
}

# AFL++ settings for shared machines and containers: no CPU binding (other builds share the
# cores), no demand on the kernel's core_pattern or CPU governor, plain log output.
afl_env() {
    export AFL_NO_AFFINITY=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
    export AFL_NO_UI=1 AFL_QUIET=1
}

run() {
    local target=$1 execs=${2:-10000000} seconds=${3:-3600}
    local out=target/fuzz/$target dict=()
    [ -f "fuzz/dict/$target.dict" ] && dict=(-x "fuzz/dict/$target.dict")
    build
    afl_env
    rm -rf "$out"
    mkdir -p "$out"
    # A copy, so that rebuilding the harness (to fix what a campaign found) leaves it running.
    cp "$HARNESS" "$out/harness"
    echo "fuzz: $target until $execs executions or $seconds s; log in $out/afl.log"
    local started
    started=$(date -u +%FT%TZ)
    nice -n 19 cargo afl fuzz -i "fuzz/corpus/$target" -o "$out" "${dict[@]}" \
        -E "$execs" -V "$seconds" -- "$out/harness" "$target" >"$out/afl.log" 2>&1 || {
        tail -n 30 "$out/afl.log" >&2
        exit 1
    }
    report "$target" "$started"
}

# The campaign's figures from AFL++'s fuzzer_stats, and its crashes copied for replay.
report() {
    local target=$1 started=$2 stats=target/fuzz/$1/default/fuzzer_stats
    local execs secs crashes hangs
    execs=$(awk -F' *: *' '$1=="execs_done"{print $2}' "$stats")
    secs=$(awk -F' *: *' '$1=="run_time"{print $2}' "$stats")
    crashes=$(awk -F' *: *' '$1=="saved_crashes"{print $2}' "$stats")
    hangs=$(awk -F' *: *' '$1=="saved_hangs"{print $2}' "$stats")
    echo "fuzz: $target: started $started, $execs executions in $secs s" \
        "($((execs / (secs > 0 ? secs : 1))) exec/s), $crashes crashes, $hangs hangs," \
        "corpus $(find "target/fuzz/$target/default/queue" -maxdepth 1 -type f | wc -l) inputs"
    if [ "$crashes" != 0 ]; then
        mkdir -p "fuzz/crashes/$target"
        local f
        for f in "target/fuzz/$target/default/crashes"/id:*; do
            cp "$f" "fuzz/crashes/$target/$(sha256sum "$f" | cut -c1-16)"
        done
        echo "fuzz: reproducers copied to fuzz/crashes/$target/" >&2
        exit 1
    fi
}

minimize() {
    local target=$1 queue=target/fuzz/$1/default/queue min=target/fuzz/$1/cmin
    [ -d "$queue" ] || { echo "fuzz: no campaign output in target/fuzz/$target" >&2; exit 1; }
    afl_env
    rm -rf "$min"
    # The awk afl-cmin, beside afl-fuzz: the Python one that `cargo afl cmin` runs finds no
    # coverage at all with this harness (AFL++ 4.40c). Edges only (-e), ignoring hit counts:
    # a few hundred files rather than a thousand, for the same edges.
    local bin
    bin=$(dirname "$(cargo afl fuzz -h 2>&1 | grep -o '/[^ ]*/afl-fuzz' | head -n 1)")
    AFL_PATH=$bin PATH=$bin:$PATH nice -n 19 "$bin/afl-cmin.awk" -e -i "$queue" -o "$min" \
        -- "$HARNESS" "$target" >/dev/null
    # Named by content: stable across campaigns; what a hand-made seed already holds is skipped.
    find "fuzz/corpus/$target" -type f ! -name 'seed-*' -delete
    local seeds f sum
    seeds=$(sha256sum "fuzz/corpus/$target"/seed-* | cut -c1-64)
    for f in "$min"/*; do
        sum=$(sha256sum "$f" | cut -c1-64)
        grep -qxF "$sum" <<<"$seeds" || cp "$f" "fuzz/corpus/$target/${sum:0:16}"
    done
    echo "fuzz: fuzz/corpus/$target holds $(find "fuzz/corpus/$target" -type f | wc -l) inputs"
}

case "${1:-}" in
    run) known_target "${2:-}"; run "$2" "${3:-}" "${4:-}" ;;
    minimize) known_target "${2:-}"; minimize "$2" ;;
    build) build ;;
    *) usage ;;
esac
