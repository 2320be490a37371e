#!/usr/bin/env bash
# Throughput of cachescope's cache and branch models alone (crates/cachesim),
# in accesses per second, for L1-hit and mostly-miss streams.
#
# For scale, the same run also times Valgrind's Cachegrind on a fixture and
# prints how many simulated accesses (Ir + Dr + Dw) per second it achieves
# end to end (instrumentation included, so this is not a like-for-like
# ratio: Valgrind has no way to run its model alone), and the throughput of
# `cachescope replay` on that fixture's Lackey trace.
#
# Usage: bench/models.sh [SCALE]   (SCALE multiplies the model stream lengths)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
scale="${1:-1}"

echo "== models alone (cargo bench -p cachesim --bench models)"
out=$(cargo bench -q -p cachesim --bench models -- "$scale" 2>/dev/null)
echo "$out"
hit_rate=$(echo "$out" | awk -F'\t' '$1 == "l1-hit reads" {print $4}')

command -v valgrind >/dev/null && command -v gcc >/dev/null || {
    echo "(valgrind or gcc missing: no comparison)"; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -O1 -o "$work/matmul" fixtures/sim/matmul.c
caches=(--I1=32768,8,64 --D1=32768,8,64 --LL=8388608,16,64)

now() { date +%s.%N; }
t0=$(now)
valgrind --tool=cachegrind --cache-sim=yes "${caches[@]}" \
    --cachegrind-out-file="$work/cg.out" "$work/matmul" >/dev/null 2>&1
t1=$(now)
read -r ir dr dw < <(awk '/^summary:/ {print $2, $5, $8}' "$work/cg.out")
accesses=$((ir + dr + dw))

valgrind --tool=lackey --trace-mem=yes --log-file="$work/t.lackey" "$work/matmul" >/dev/null
cargo build -q --release -p cachescope
t2=$(now)
"$CARGO_TARGET_DIR/release/cachescope" replay "${caches[@]}" \
    --cachegrind-out-file="$work/r.out" "$work/t.lackey" 2>/dev/null
t3=$(now)
bytes=$(stat -c %s "$work/t.lackey")

awk -v a="$accesses" -v t0="$t0" -v t1="$t1" -v t2="$t2" -v t3="$t3" \
    -v hit="$hit_rate" -v bytes="$bytes" 'BEGIN {
    cg = t1 - t0; rp = t3 - t2; vg = a / cg / 1e6;
    printf "== for scale (fixtures/sim/matmul.c, %d simulated accesses)\n", a;
    printf "valgrind --tool=cachegrind end to end: %.1f M accesses/s (%.2f s)\n", vg, cg;
    printf "cachescope replay of its Lackey trace: %.1f M accesses/s, %.0f MB/s of trace (%.2f s)\n",
        a / rp / 1e6, bytes / rp / 1e6, rp;
    printf "model L1-hit rate / Cachegrind end-to-end rate: %.1fx\n", hit / vg;
}'
