#!/usr/bin/env bash
# Live simulation benchmark (issue 8): the engine suite's bzip2 and
# python-json workloads under `valgrind --tool=cachegrind` and cachescope
# with the cache simulation, then also with the branch simulation, then
# with neither (to see what tracing costs over counting), and last
# `--tool=callgrind --cache-sim=no` under both (issue 11: call stacks must
# not make it slower than 2x the --cache-sim=no pass). Every run is
# checked against the native one and timed in the same run as Valgrind's
# (bench/engine.sh does the work: inputs, checks, ratios, peak RSS).
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
for sim in "--cache-sim=yes" "--cache-sim=yes --branch-sim=yes" "--cache-sim=no"; do
    echo "=== $sim"
    BENCH_SIM="$sim" bench/engine.sh "${args[@]}" "${workloads[@]}" || status=$?
done
echo "=== --tool=callgrind --cache-sim=no"
BENCH_TOOL=callgrind BENCH_SIM="--cache-sim=no" bench/engine.sh "${args[@]}" "${workloads[@]}" ||
    status=$?
exit "$status"
