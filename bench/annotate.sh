#!/usr/bin/env bash
# Times `cachescope annotate` against the Valgrind annotators on this
# machine, on a generated profile (Cachegrind's format and --cache-sim=yes
# events; 70 MB and about 1.6 million lines by default).
#
#   * Valgrind's installed `cg_annotate` (the Perl one in 3.19, the Python one
#     from 3.21 on), with `--auto=no`;
#   * the current Python cg_annotate too, if $CG_ANNOTATE_PY names a copy
#     (cachegrind/cg_annotate.in with @VERSION@ substituted), with
#     `--no-annotate`; its output must then equal ours but for the
#     Invocation line.
#
# Each run reports elapsed seconds and peak RSS (/usr/bin/time -v), then the
# ratios against cachescope from the same run. Runs with annotation on
# (all sources unreadable, so this measures reading and aggregation) are
# reported too.
#
# Usage: bench/annotate.sh [MEGABYTES]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
megabytes="${1:-70}"

cargo build -q --release -p cachescope -p profile --example gen_profile
bin="$CARGO_TARGET_DIR/release/cachescope"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
profile="$work/big.cgout"
"$CARGO_TARGET_DIR/release/examples/gen_profile" "$profile" "$megabytes"
size=$(stat -c %s "$profile")
echo "profile: $((size / 1000000)) MB, $(wc -l < "$profile") lines"

# run NAME OUTPUT COMMAND...: prints "NAME  seconds  peak-KB", and records
# the seconds in $last_secs.
run() {
    local name="$1" out="$2"
    shift 2
    /usr/bin/time -v -o "$work/time" "$@" > "$out"
    last_secs=$(awk -F': ' '/Elapsed \(wall clock\)/ {
        n = split($2, t, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + t[i]; print s }' "$work/time")
    local kb
    kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$work/time")
    printf '%-44s %8.2f s %10d KB peak RSS\n' "$name" "$last_secs" "$kb"
    last_kb=$kb
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a / b }'; }

run "cachescope annotate --no-annotate" "$work/ours.txt" "$bin" annotate --no-annotate "$profile"
ours=$last_secs
ours_kb=$last_kb
if [ $((ours_kb * 1024)) -lt "$size" ]; then
    echo "  peak RSS is below the profile's size ($((size / 1024)) KB)"
else
    echo "  peak RSS is NOT below the profile's size ($((size / 1024)) KB)"
fi
run "cachescope annotate (annotation on)" "$work/ours-ann.txt" "$bin" annotate "$profile"
ours_ann=$last_secs

if [ -x /usr/bin/cg_annotate ]; then
    run "/usr/bin/cg_annotate --auto=no" "$work/valgrind.txt" /usr/bin/cg_annotate --auto=no "$profile"
    echo "  cachescope is $(ratio "$last_secs" "$ours")x faster"
fi
if [ -n "${CG_ANNOTATE_PY:-}" ]; then
    run "Python cg_annotate --no-annotate" "$work/py.txt" python3 "$CG_ANNOTATE_PY" --no-annotate "$profile"
    echo "  cachescope is $(ratio "$last_secs" "$ours")x faster"
    if cmp -s <(grep -v '^Invocation:' "$work/ours.txt") <(grep -v '^Invocation:' "$work/py.txt"); then
        echo "  outputs are identical"
    else
        echo "  OUTPUTS DIFFER"
    fi
    run "Python cg_annotate (annotation on)" "$work/py-ann.txt" python3 "$CG_ANNOTATE_PY" "$profile"
    echo "  cachescope is $(ratio "$last_secs" "$ours_ann")x faster"
fi
