#!/usr/bin/env bash
# Live simulation benchmark (issue 8): the engine suite's bzip2 and
# python-json workloads under `valgrind --tool=cachegrind` and cachescope
# with the cache simulation, then also with the branch simulation, then
# with neither (to see what tracing costs over counting), then with the
# branch simulation alone (`--cache-sim=no --branch-sim=yes`), and last
# `--tool=callgrind --cache-sim=no` under both (issue 11: call stacks must
# not make it slower than 2x the --cache-sim=no pass), and that again with
# the calling contexts kept in the client (`--client-contexts=yes`). Every run is
# checked against the native one and timed in the same run as Valgrind's
# (bench/engine.sh does the work: inputs, checks, ratios, peak memory).
# Last, the figures are set against the acceptance bars: with the cache
# simulation (and with the branch simulation too) cachescope at least 3x
# faster than Cachegrind on bzip2 and 2x on the python workload, with no
# more peak memory (the branch simulation alone is held to the same
# speed); --tool=callgrind --cache-sim=no at most 2x our
# --cache-sim=no. (A workload outside those two gets the python bar.)
#
# Usage: bench/sim.sh [-n RUNS] [WORKLOAD...]   (default: bzip2 python-json)
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
while getopts n: opt; do
    case $opt in
        n) args+=(-n "$OPTARG") ;;
        *) echo "usage: bench/sim.sh [-n RUNS] [WORKLOAD...]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
workloads=("$@")
[[ ${#workloads[@]} -gt 0 ]] || workloads=(bzip2 python-json)
status=0
results=$(mktemp -d "${TMPDIR:-/tmp}/cachescope-sim.XXXXXX")
passes=("--cache-sim=yes" "--cache-sim=yes --branch-sim=yes" "--cache-sim=no")
for i in "${!passes[@]}"; do
    echo "=== ${passes[$i]}"
    BENCH_SIM="${passes[$i]}" BENCH_RESULTS="$results/$i" bench/engine.sh "${args[@]}" \
        "${workloads[@]}" || status=$?
done
echo "=== --cache-sim=no --branch-sim=yes"
BENCH_SIM="--cache-sim=no --branch-sim=yes" BENCH_RESULTS="$results/branch" \
    bench/engine.sh "${args[@]}" "${workloads[@]}" || status=$?
echo "=== --tool=callgrind --cache-sim=no"
BENCH_TOOL=callgrind BENCH_SIM="--cache-sim=no" BENCH_RESULTS="$results/callgrind" \
    bench/engine.sh "${args[@]}" "${workloads[@]}" || status=$?
echo "=== --tool=callgrind --cache-sim=no, cachescope with --client-contexts=yes"
BENCH_TOOL=callgrind BENCH_SIM="--cache-sim=no" BENCH_CS_OPTS="--client-contexts=yes" \
    BENCH_RESULTS="$results/contexts" bench/engine.sh "${args[@]}" "${workloads[@]}" || status=$?

echo
echo "=== against the acceptance bars (cs = cachescope, cg = Cachegrind, vg = Valgrind's tool)"
# Rows: workload, wall native/valgrind/cachescope, RSS KB native/valgrind/
# cachescope, ... (see bench/engine.sh). A pass whose file is missing
# (engine.sh failed before writing it) shows as "-".
touch "$results/0" "$results/1" "$results/2" "$results/branch" "$results/callgrind" \
    "$results/contexts"
awk -F'\t' '
function bar(w) { return w == "bzip2" ? 3 : 2 }
function speed(f, w,   r) {
    if (!((f, w) in vg) || cs[f, w] == "-" || vg[f, w] == "-") return sprintf("%-22s", "-")
    r = vg[f, w] / (cs[f, w] > 0 ? cs[f, w] : 0.01)
    return sprintf("%-22s", sprintf("%.1fx (bar %dx) %s", r, bar(w), r >= bar(w) ? "ok" : "NO"))
}
function overhead(f, w,   r) {
    if (!((f, w) in cs && ("2", w) in cs) || cs[f, w] == "-" || cs["2", w] == "-") return "-"
    r = cs[f, w] / (cs["2", w] > 0 ? cs["2", w] : 0.01)
    return sprintf("%.1fx %s", r, r <= 2 ? "ok" : "NO")
}
function memory(f, w) {
    if (!((f, w) in vg) || mcs[f, w] == "-" || mvg[f, w] == "-") return sprintf("%-20s", "-")
    return sprintf("%-20s", sprintf("%.0f/%.0f MB %s", mcs[f, w] / 1024, mvg[f, w] / 1024,
        mcs[f, w] <= mvg[f, w] ? "ok" : "NO"))
}
{
    f = FILENAME; sub(/.*\//, "", f)
    vg[f, $1] = $3; cs[f, $1] = $4; mvg[f, $1] = $6; mcs[f, $1] = $7
    if (!($1 in seen)) { seen[$1] = 1; order[n++] = $1 }
}
END {
    printf "%-13s %-22s %-20s %-22s %-20s %-22s %-18s %s\n", "workload", "cache-sim: vg/cs",
        "RSS cs/cg", "+branch-sim: vg/cs", "RSS cs/cg", "branch-sim alone", "callgrind/no-sim",
        "client-contexts/no-sim (bar 2x: either)"
    for (i = 0; i < n; i++) {
        w = order[i]
        printf "%-13s %s %s %s %s %s %-18s %s\n", w, speed("0", w), memory("0", w), speed("1", w),
            memory("1", w), speed("branch", w), overhead("callgrind", w), overhead("contexts", w)
    }
}' "$results/0" "$results/1" "$results/2" "$results/branch" "$results/callgrind" \
    "$results/contexts"
rm -rf "$results"
exit "$status"
