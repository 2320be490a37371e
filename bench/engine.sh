#!/usr/bin/env bash
# Engine benchmark: `bzip2 -c` of a generated 5 MB file, run natively, under
# `valgrind --tool=cachegrind --cache-sim=no` and under
# `cachescope --cache-sim=no`, in the same run. Prints wall time and peak
# RSS of each (best of N runs, from /usr/bin/time) and the ratios.
#
# Usage: bench/engine.sh [runs]        (default 3)
# Env:   CACHESCOPE=path/to/cachescope (default: builds the release binary)
#        BENCH_SIZE_MB=5
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-3}
size_mb=${BENCH_SIZE_MB:-5}
work=$(mktemp -d "${TMPDIR:-/tmp}/cachescope-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [[ -z "${CACHESCOPE:-}" ]]; then
    cargo build --release -q -p cachescope
    CACHESCOPE="${CARGO_TARGET_DIR:-target}/release/cachescope"
fi
for tool in /usr/bin/time bzip2 valgrind "$CACHESCOPE"; do
    command -v "$tool" >/dev/null || { echo "engine.sh: $tool not found" >&2; exit 1; }
done

# Compressible, varied, deterministic input (not random bytes: bzip2's work
# on real text is what matters).
input="$work/input.txt"
python3 - "$input" "$size_mb" <<'EOF'
import sys
path, mb = sys.argv[1], int(sys.argv[2])
words = ["cache", "line", "miss", "branch", "profile", "engine", "count", "block", "the", "of"]
x, out, n = 0x2545F4914F6CDD1D, [], 0
while n < mb << 20:
    x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF; x ^= x >> 7; x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
    s = f"{words[x % len(words)]} {x % 1000} {(x >> 20) % 97}\n"
    out.append(s); n += len(s)
open(path, "w").write("".join(out))
EOF

# best_of LABEL CMD...: runs CMD $runs times, keeps the best wall time and
# the peak RSS of that run; the output must equal the native one.
best_of() {
    local label=$1; shift
    local best_t="" best_m=""
    for _ in $(seq "$runs"); do
        /usr/bin/time -f "%e %M" -o "$work/time" "$@" > "$work/out.$label" 2>"$work/err.$label"
        read -r t m < "$work/time"
        if [[ -z "$best_t" ]] || awk "BEGIN{exit !($t < $best_t)}"; then
            best_t=$t; best_m=$m
        fi
    done
    if [[ "$label" != native ]] && ! cmp -s "$work/out.native" "$work/out.$label"; then
        echo "engine.sh: $label output differs from native" >&2; exit 1
    fi
    eval "${label}_t=$best_t; ${label}_m=$best_m"
}

cd "$work"
best_of native bzip2 -c "$input"
best_of valgrind valgrind -q --tool=cachegrind --cache-sim=no \
    --cachegrind-out-file="$work/vg.out" bzip2 -c "$input"
best_of cachescope "$CACHESCOPE" -q --cache-sim=no \
    --cachegrind-out-file="$work/cs.out" bzip2 -c "$input"

ir_vg=$(sed -n 's/^summary: //p' "$work/vg.out")
ir_cs=$(sed -n 's/^summary: //p' "$work/cs.out")

printf '%-11s %9s %11s %12s\n' "" "wall (s)" "peak RSS (KB)" "Ir"
printf '%-11s %9s %11s %12s\n' native "$native_t" "$native_m" "-"
printf '%-11s %9s %11s %12s\n' valgrind "$valgrind_t" "$valgrind_m" "$ir_vg"
printf '%-11s %9s %11s %12s\n' cachescope "$cachescope_t" "$cachescope_m" "$ir_cs"
awk -v n="$native_t" -v v="$valgrind_t" -v c="$cachescope_t" \
    -v nm="$native_m" -v vm="$valgrind_m" -v cm="$cachescope_m" 'BEGIN {
    n = (n > 0) ? n : 0.01
    printf "cachescope / native:    %.2fx time, %.2fx memory\n", c / n, cm / nm
    printf "valgrind / native:      %.2fx time, %.2fx memory\n", v / n, vm / nm
    printf "valgrind / cachescope:  %.2fx time (cachescope is that much faster)\n", v / c
}'
