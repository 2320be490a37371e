#!/usr/bin/env bash
# Engine benchmark suite (issue 7). Each workload runs natively, under
# `valgrind --tool=cachegrind --cache-sim=no` and under
# `cachescope --cache-sim=no`, in the same run:
#
#   python-json    python3: a 300,000-entry dict through json.dumps/json.loads
#   gcc            gcc -O2 -c of a generated C file of 300 functions (cc1, as)
#   python-import  python3 -c 'import ...' of 11 standard-library packages
#   bzip2          bzip2 -c of 5 MB of generated text
#   sqlite         sqlite3 :memory: on 20,000 INSERTs, an index, two queries
#   perl-regex     perl -e: a regex match/substitution loop over generated text
#   g++            g++ -O1 -c of generated template-heavy C++ (cc1plus, as)
#   xz-T2          xz -T2 -6 of 8 MB in 1 MiB blocks: really two threads
#
# Compilers run with --trace-children=yes under both tools, since the work
# is in the programs gcc execs. Every input is generated here, deterministically.
#
# Each run of a tool must reproduce the native run: same exit status, same
# stdout and stderr (both tools get -q; the warnings Valgrind prints even
# then are left out), same bytes in the files the workload writes. Otherwise the
# workload's row says MISMATCH, the difference is printed at once and kept
# on disk, and the script exits non-zero at the end after running the rest.
#
# Times and peak memory come from bench/measure.py: the wall time as
# `/usr/bin/time -f "%e"`, the peak as the highest sum of the proportional
# set sizes of every process of the tree at one moment (sampled every
# 100 ms, and at least the largest single process's peak RSS). The tree
# includes cachescope's detached tracer (one process under Valgrind); Pss
# counts the memory the client and the tracer share (trace buffers, code
# chunks) once.
# Runs are interleaved (native, valgrind, cachescope, then again) so that
# load from other processes on the machine hits all three alike, and the
# BEST (lowest) wall time of the N runs is kept: on a shared machine the
# noise only ever adds time. Peak memory comes from the first run of each
# runner alone; the later ones are not sampled (MEASURE_PEAK=no), because
# the sampler's page-table walks take CPU that a tool keeping both cores
# busy loses in wall time and a single-threaded one does not (see
# measure.py). With -n 1 that one run is both timed and sampled. Ir totals are the sum of
# the `summary:` lines of all of a run's profiles (one per process with
# --trace-children=yes), so that count differences between the tools show.
#
# Usage: bench/engine.sh [-n RUNS] [WORKLOAD...]   (RUNS 3, all workloads)
# Env:   CACHESCOPE=path  binary to measure (default: cargo build --release,
#                         $CARGO_TARGET_DIR honoured); it is copied once, as
#                         target/ may be rebuilt while the suite runs.
#        BENCH_STATS=1    also run cachescope once more per workload with
#                         --stats=yes and keep its stderr (path printed).
#        BENCH_SIM="..."  the simulation options both tools get instead of
#                         --cache-sim=no (bench/sim.sh sets it).
#        BENCH_TOOL=callgrind  run --tool=callgrind under both instead of
#                         cachegrind (bench/sim.sh's last passes); cachescope
#                         then also runs its counting mode (--tool=cachegrind
#                         --cache-sim=no) in the same interleaved sequence,
#                         and the table shows Callgrind's time over it (issue
#                         11's bound: at most 2x).
#        BENCH_CS_OPTS="..."  options cachescope alone gets (bench/sim.sh:
#                         --client-contexts=yes).
#        BENCH_RESULTS=path  also write the rows (tab-separated: workload,
#                         wall native/valgrind/cachescope, peak memory KB of
#                         each, Ir and profiles of each tool, status) there.
set -euo pipefail
cd "$(dirname "$0")/.."
measure=$PWD/bench/measure.py

all_workloads=(python-json gcc python-import bzip2 sqlite perl-regex g++ xz-T2)
declare -A workload_fn=(
    [python-json]=wl_python_json [gcc]=wl_gcc [python-import]=wl_python_import
    [bzip2]=wl_bzip2 [sqlite]=wl_sqlite [perl-regex]=wl_perl_regex
    [g++]=wl_gxx [xz-T2]=wl_xz_t2
)

usage() {
    echo "usage: bench/engine.sh [-n RUNS] [WORKLOAD...]" >&2
    echo "workloads: ${all_workloads[*]}" >&2
    exit 2
}

runs=3
while getopts n:h opt; do
    case $opt in
        n) runs=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[[ $runs =~ ^[1-9][0-9]*$ ]] || usage
selected=("$@")
[[ ${#selected[@]} -gt 0 ]] || selected=("${all_workloads[@]}")
for w in "${selected[@]}"; do
    [[ -n ${workload_fn[$w]:-} ]] || { echo "engine.sh: unknown workload '$w'" >&2; usage; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/cachescope-bench.XXXXXX")
# Evidence that outlives the run (mismatching outputs, --stats output);
# removed at exit if nothing was put there.
keep=$(mktemp -d "${TMPDIR:-/tmp}/cachescope-bench-kept.XXXXXX")
trap 'rm -rf "$work"; rmdir "$keep" 2>/dev/null || true' EXIT

if [[ -z "${CACHESCOPE:-}" ]]; then
    cargo build --release -q -p cachescope
    CACHESCOPE="${CARGO_TARGET_DIR:-target}/release/cachescope"
fi
for tool in python3 valgrind "$CACHESCOPE"; do
    command -v "$tool" >/dev/null || { echo "engine.sh: $tool not found" >&2; exit 1; }
done
cp "$(command -v "$CACHESCOPE")" "$work/cachescope"
cachescope="$work/cachescope"

# The real interpreter, not a version manager's shell-script shim: under a
# tool without --trace-children the shim would be measured and Python not.
python=$(python3 -c 'import sys; print(sys.executable)')

# Same output on every run and under every tool: no hash randomisation,
# no .pyc writes on the first run only, no locale-dependent messages.
export PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1 LC_ALL=C

stats=no
if [[ ${BENCH_STATS:-} == 1 ]]; then
    if "$cachescope" -q --stats=yes --cache-sim=no --cachegrind-out-file=/dev/null true \
        2>"$work/stats-probe" >/dev/null; then
        stats=yes
    else
        echo "engine.sh: BENCH_STATS=1 but cachescope --stats=yes is unavailable:" \
            "$(head -n 1 "$work/stats-probe")" >&2
    fi
fi

echo "cachescope: $CACHESCOPE ($("$cachescope" --version 2>&1 | head -n 1)); valgrind: $(valgrind --version)"
echo "best of $runs run(s); work dir $work; tools run with ${BENCH_SIM:---cache-sim=no}"

# ---------------------------------------------------------------------------
# Input generators. Python with a fixed xorshift, never `random`, so the
# inputs are the same on every machine and Python version.

# gen_text PATH MEGABYTES SEED: compressible, varied text (not random bytes:
# compressors' and regexes' work on real text is what matters).
gen_text() {
    python3 - "$@" <<'EOF'
import sys
path, mb, x = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
M = 0xFFFFFFFFFFFFFFFF
words = ["cache", "line", "miss", "branch", "profile", "engine", "count", "block",
         "the", "of", "thread", "signal", "translate", "counter", "stub", "chunk"]
out, n = [], 0
while n < mb << 20:
    x ^= (x << 13) & M; x ^= x >> 7; x ^= (x << 17) & M
    s = f"{words[x % 16]} {words[(x >> 8) % 16]}={x % 1000} {(x >> 20) % 97} id{(x >> 30) % 4099}\n"
    out.append(s); n += len(s)
open(path, "w").write("".join(out))
EOF
}

# ---------------------------------------------------------------------------
# Workloads. Each gets a directory for its inputs and sets:
#   cmd       the command line (run in a fresh per-runner working directory)
#   trace     --trace-children for both tools
#   produced  files the command writes, relative to its working directory,
#             compared byte for byte with the native run's

wl_python_json() {
    cat >"$1/json_roundtrip.py" <<'EOF'
import json, zlib
d = {f"key{i}": [i, i * 7919 % 1000, f"v{i % 97}", i / 8, i % 3 == 0]
     for i in range(300_000)}
s = json.dumps(d)
back = json.loads(s)
assert back == d
print(len(back), len(s), zlib.crc32(s.encode()))
EOF
    cmd=("$python" "$1/json_roundtrip.py")
}

wl_gcc() {
    # Varied bodies (loops, switches, straight-line arithmetic, nested loops,
    # calls to earlier functions) so that cc1 exercises many passes.
    python3 - "$1/gen.c" <<'EOF'
import sys
M = 0xFFFFFFFFFFFFFFFF
x = 0x9E3779B97F4A7C15
def rnd(k):
    global x
    x ^= (x << 13) & M; x ^= x >> 7; x ^= (x << 17) & M
    return x % k if k else 0
ops = ["+", "-", "*", "^", "|", "&"]
def expr(i, depth=0):
    if depth > 2 or rnd(3) == 0:
        return ["a", "b", "t", str(rnd(1000) + 1)][rnd(4)]
    if i and rnd(6) == 0:
        return f"f{rnd(i)}({expr(i, depth + 1)}, {expr(i, depth + 1)})"
    return f"({expr(i, depth + 1)} {ops[rnd(6)]} {expr(i, depth + 1)})"
out = ["unsigned long g_tab[256];", "unsigned long g_acc;", ""]
for i in range(300):
    out.append(f"unsigned long f{i}(unsigned long a, unsigned long b)\n{{\n    unsigned long t = {rnd(100)};")
    kind = rnd(5)
    if kind == 0:
        out.append(f"    for (unsigned long k = 0; k < (a & 63); k++) {{\n"
                   f"        t += (k * {rnd(97) + 1}) ^ (b >> {rnd(13)});\n"
                   f"        if (t & {1 << rnd(8)}) t -= g_tab[(k + {rnd(256)}) & 255];\n"
                   f"        else t = {expr(i)};\n    }}")
    elif kind == 1:
        out.append(f"    switch ((a ^ b) & 15) {{")
        for c in range(rnd(10) + 4):
            out.append(f"    case {c}: t = {expr(i)}; {'break;' if rnd(4) else '/* fallthrough */'}")
        out.append(f"    default: t = {expr(i)}; break;\n    }}")
    elif kind == 2:
        for _ in range(rnd(12) + 6):
            out.append(f"    t = {expr(i)};")
    elif kind == 3:
        out.append(f"    for (int r = 0; r < {rnd(8) + 2}; r++)\n"
                   f"        for (int c = r; c < 256; c += {rnd(7) + 1}) {{\n"
                   f"            g_tab[c] += t ^ r;\n"
                   f"            t = t * {rnd(31) + 3} + g_tab[(c * {rnd(17) + 1}) & 255];\n"
                   f"        }}")
    else:
        out.append(f"    unsigned long k = 0;\n    do {{\n        t += {expr(i)};\n"
                   f"        a = (a >> 1) ^ (t & {rnd(255)});\n    }} while (++k < (b & 15));")
    out.append(f"    g_acc += t;\n    return t ^ {expr(i)};\n}}\n")
open(sys.argv[1], "w").write("\n".join(out))
EOF
    cmd=(gcc -O2 -c "$1/gen.c" -o gen.o)
    trace=yes
    produced=(gen.o)
}

wl_python_import() {
    cmd=("$python" -c '
import json, decimal, email, http.client, xml.dom.minidom, argparse, asyncio
import sqlite3, unittest, logging, csv, sys
doc = xml.dom.minidom.parseString("<a><b>1</b><b>2</b></a>")
print(json.dumps({"seventh": str(decimal.Decimal(1) / 7),
                  "b": len(doc.getElementsByTagName("b")),
                  "status": http.client.responses[404]}, sort_keys=True))
print(sorted(m for m in sys.modules if not m.startswith("_"))[:5])
')
}

wl_bzip2() {
    gen_text "$1/input.txt" 5 $((0x2545F4914F6CDD1D))
    cmd=(bzip2 -c "$1/input.txt")
}

wl_sqlite() {
    python3 - "$1/script.sql" <<'EOF'
import sys
M = 0xFFFFFFFFFFFFFFFF
x = 0x853C49E6748FEA9B
out = ["CREATE TABLE t(id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, val INTEGER);",
       "BEGIN;"]
for i in range(20_000):
    x ^= (x << 13) & M; x ^= x >> 7; x ^= (x << 17) & M
    out.append(f"INSERT INTO t VALUES({i}, {x % 37}, 'n{(x >> 12) % 5003}', {(x >> 24) % 100000});")
out += ["COMMIT;",
        "CREATE INDEX t_val ON t(val);",
        "SELECT grp, count(*), sum(val), min(name), max(name) FROM t GROUP BY grp ORDER BY grp;",
        "SELECT count(*), sum(id), min(val), max(val) FROM t WHERE val BETWEEN 25000 AND 26500;"]
open(sys.argv[1], "w").write("\n".join(out) + "\n")
EOF
    cmd=(sqlite3 -batch :memory: ".read $1/script.sql")
}

wl_perl_regex() {
    gen_text "$1/input.txt" 3 $((0x6A09E667F3BCC908))
    # About 120,000 key=value captures, 210,000 word matches and 180,000
    # substitutions (so the text the last regex sees has changed).
    # shellcheck disable=SC2016 # Perl variables, not the shell's
    cmd=(perl -e '
my ($pairs, $sum, $words, $subs, $ids) = (0, 0, 0, 0, 0);
while (<>) {
    while (/(\w+)=(\d+)/g) { $pairs++; $sum += $2 }
    $words++ while /\b[a-z]{4,}\b/g;
    $subs += s/\b(cache|miss|stub|line)\b/\U$1/g;
    $subs += s/(\d+)$/<$1>/;
    $ids++ if /\bid\d*7\b|\b(?:LINE|STUB)=\d{3}\b/;
}
print "pairs=$pairs sum=$sum words=$words subs=$subs ids=$ids\n";
' "$1/input.txt")
}

wl_gxx() {
    # A few class templates (std::map, std::vector, std::function inside),
    # instantiated over many generated types.
    python3 - "$1/gen.cpp" <<'EOF'
import sys
n = 8
out = ["""#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <vector>

template <typename K, typename V> class Registry {
    std::map<K, std::vector<V>> items_;
    std::vector<std::function<V(const V&)>> hooks_;
public:
    void hook(std::function<V(const V&)> f) { hooks_.push_back(std::move(f)); }
    void add(const K& k, V v) { for (auto& h : hooks_) v = h(v); items_[k].push_back(std::move(v)); }
    std::size_t count() const { std::size_t c = 0; for (auto& kv : items_) c += kv.second.size(); return c; }
    template <typename F> V fold(V init, F f) const {
        for (auto& kv : items_) for (auto& v : kv.second) init = f(init, v);
        return init;
    }
};

template <typename T> class Pipeline {
    std::vector<std::function<T(T)>> stages_;
public:
    Pipeline& then(std::function<T(T)> f) { stages_.push_back(std::move(f)); return *this; }
    T run(T v) const { for (auto& s : stages_) v = s(v); return v; }
    std::vector<T> run_all(std::vector<T> vs) const {
        std::transform(vs.begin(), vs.end(), vs.begin(), [this](T v) { return run(v); });
        std::sort(vs.begin(), vs.end());
        return vs;
    }
};

template <typename T, int N> struct Matrix {
    T cells[N][N] = {};
    Matrix operator*(const Matrix& o) const {
        Matrix r;
        for (int i = 0; i < N; i++) for (int j = 0; j < N; j++) for (int k = 0; k < N; k++)
            r.cells[i][j] = r.cells[i][j] + cells[i][k] * o.cells[k][j];
        return r;
    }
};
"""]
for k in range(n):
    out.append(f"""
struct S{k} {{
    long a = {k}; double b = {k}.5; std::string tag = "s{k}";
    bool operator<(const S{k}& o) const {{ return a < o.a || (a == o.a && b < o.b); }}
    S{k} operator+(const S{k}& o) const {{ S{k} r = *this; r.a += o.a; r.b += o.b; return r; }}
    S{k} operator*(const S{k}& o) const {{ S{k} r = *this; r.a *= o.a; r.b *= o.b; return r; }}
}};

long use_s{k}(int n) {{
    Registry<std::string, S{k}> byname;
    Registry<int, S{k}> byid;
    byname.hook([](const S{k}& s) {{ S{k} r = s; r.a += {k + 1}; return r; }});
    byid.hook([n](const S{k}& s) {{ S{k} r = s; r.b *= n; return r; }});
    Pipeline<S{k}> p;
    p.then([](S{k} s) {{ s.a ^= {k * 7 + 3}; return s; }}).then([](S{k} s) {{ s.tag += "!"; return s; }});
    std::vector<S{k}> vs(n);
    for (int i = 0; i < n; i++) {{ vs[i].a = i * {k + 3} % 17; byname.add(vs[i].tag + std::to_string(i % 5), vs[i]); byid.add(i % 7, vs[i]); }}
    auto sorted = p.run_all(vs);
    Matrix<S{k}, 3> m, m2 = m * m;
    auto total = byid.fold(S{k}{{}}, [](S{k} x, const S{k}& y) {{ return x + y; }});
    return total.a + (long)byname.count() + sorted.front().a + m2.cells[1][2].a;
}}""")
out.append("\nlong use_all(int n) {\n    long t = 0;")
out += [f"    t += use_s{k}(n);" for k in range(n)]
out.append("    return t;\n}\n")
open(sys.argv[1], "w").write("\n".join(out))
EOF
    cmd=(g++ -O1 -c "$1/gen.cpp" -o gen.o)
    trace=yes
    produced=(gen.o)
}

wl_xz_t2() {
    # xz -T2 cuts the input into blocks and compresses two at a time; 8 MB in
    # 1 MiB blocks keeps both threads busy for most of the run.
    gen_text "$1/input.txt" 8 $((0xBB67AE8584CAA73B))
    cmd=(xz -T2 -6 --block-size=1MiB -c "$1/input.txt")
}

# ---------------------------------------------------------------------------
# The runner.

# run_once RUNNER DIR: runs $cmd once under RUNNER (native, valgrind,
# cachescope, or counting: cachescope --tool=cachegrind --cache-sim=no) in a
# fresh DIR/RUNNER; sets t (s), m (KB) and rc.
run_once() {
    local runner=$1 dir=$2/$1
    rm -rf "$dir" "$dir.prof"
    mkdir -p "$dir" "$dir.prof"
    local -a tool=()
    local -a sim_opts
    read -r -a sim_opts <<<"${BENCH_SIM:---cache-sim=no}"
    local name=${BENCH_TOOL:-cachegrind}
    local -a tool_opts=(-q "${sim_opts[@]}" "--trace-children=$trace"
                        "--$name-out-file=$dir.prof/$name.out.%p")
    case $runner in
        valgrind) tool=(valgrind "--tool=$name" "${tool_opts[@]}") ;;
        cachescope)
            local -a cs_opts
            read -r -a cs_opts <<<"${BENCH_CS_OPTS:-}"
            tool=("$cachescope" "--tool=$name" "${tool_opts[@]}" "${cs_opts[@]}") ;;
        counting)
            tool=("$cachescope" --tool=cachegrind -q --cache-sim=no "--trace-children=$trace"
                  "--cachegrind-out-file=$dir.prof/cachegrind.out.%p") ;;
    esac
    rc=0
    (cd "$dir" && MEASURE_PEAK=$sample_peak exec "$python" "$measure" "$dir.time" \
        "${tool[@]}" "${cmd[@]}" >"$dir.stdout" 2>"$dir.stderr") || rc=$?
    read -r t m < <(tail -n 1 "$dir.time")
}

# check RUNNER DIR NAME: does RUNNER's run equal the native one? Prints each
# difference loudly and keeps both sides in $keep.
check() {
    local runner=$1 dir=$2 name=$3 ok=yes what a b
    if [[ $rc != "$native_rc" ]]; then
        echo "engine.sh: MISMATCH $name/$runner: exit status $rc, native $native_rc" >&2
        ok=no
    fi
    # Valgrind warns about the host's caches on stderr even with -q and
    # --cache-sim=no: the tools' own "==pid==" and "--pid--" lines are not
    # the client's.
    grep -Ev '^(==|--)[0-9]+(==|--) ' "$dir/$runner.stderr" >"$dir/$runner.client-stderr" || true
    for what in stdout client-stderr "${produced[@]}"; do
        case $what in
            stdout) a=$dir/native.stdout b=$dir/$runner.stdout ;;
            client-stderr) a=$dir/native.stderr b=$dir/$runner.client-stderr ;;
            *) a=$dir/native/$what b=$dir/$runner/$what ;;
        esac
        [[ -e $b ]] || { echo "engine.sh: MISMATCH $name/$runner: $what not written" >&2; ok=no; continue; }
        cmp -s "$a" "$b" && continue
        ok=no
        echo "engine.sh: MISMATCH $name/$runner: $what differs from native" \
            "(native $(stat -c %s "$a") bytes, $runner $(stat -c %s "$b") bytes;" \
            "$(cmp "$a" "$b" 2>&1 | head -n 1 | sed "s|$dir/||g"))" >&2
        if grep -qI . "$a" && grep -qI . "$b"; then
            diff "$a" "$b" | head -n 20 | sed 's/^/    /' >&2 || true
        fi
        mkdir -p "$keep/$name"
        cp "$a" "$keep/$name/native.${what//\//_}"
        cp "$b" "$keep/$name/$runner.${what//\//_}"
        echo "    both kept in $keep/$name/" >&2
    done
    [[ $ok == yes ]]
}

# ir_total DIR: the Ir of all profiles of the last run, and how many. (%.0f:
# mawk's %d stops at 2^31.)
ir_total() {
    cat "$1".prof/*.out.* 2>/dev/null |
        awk '/^summary:/ { s += $2; n++ } END { printf "%.0f %d\n", s, n }'
}

failed_row() { printf '%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%s\t-\n' "$1" "$2" >>"$work/results"; }

# Runners of each workload, in the order they run.
runners=(native valgrind cachescope)
[[ ${BENCH_TOOL:-cachegrind} != callgrind ]] || runners+=(counting)

# run_workload NAME: one row of $work/results (tab-separated): name, best
# wall time and first-run peak memory per runner, Ir totals and profile
# counts, status, and the counting runner's best wall time ("-" without it).
run_workload() {
    local name=$1 dir=$work/$1
    mkdir -p "$dir/in"
    cmd=() trace=no produced=()
    "${workload_fn[$name]}" "$dir/in"

    local -A best_t=() best_m=() bad=()
    local runner i
    for ((i = 1; i <= runs; i++)); do
        # Memory from the first run, times from all (see the top).
        sample_peak=$([[ $i == 1 ]] && echo yes || echo no)
        for runner in "${runners[@]}"; do
            run_once "$runner" "$dir"
            if [[ $runner == native ]]; then
                native_rc=$rc
                if [[ $rc != 0 ]]; then
                    echo "engine.sh: $name fails natively (exit status $rc):" >&2
                    head -n 20 "$dir/native.stderr" | sed 's/^/    /' >&2
                    failed_row "$name" "FAILED natively"
                    return 0
                fi
            elif ! check "$runner" "$dir" "$name"; then
                bad[$runner]=1
            fi
            if [[ -z ${best_t[$runner]:-} ]] || awk "BEGIN { exit !($t < ${best_t[$runner]}) }"; then
                best_t[$runner]=$t
            fi
            [[ $sample_peak == no ]] || best_m[$runner]=$m
        done
        echo "  $name run $i: native ${best_t[native]} s, valgrind ${best_t[valgrind]} s," \
            "cachescope ${best_t[cachescope]} s${best_t[counting]:+, counting ${best_t[counting]} s}" \
            "(best so far)"
    done

    local status=ok ir_vg n_vg ir_cs n_cs
    [[ ${#bad[@]} -eq 0 ]] || status="MISMATCH ($(printf '%s\n' "${!bad[@]}" | sort | paste -sd ,))"
    read -r ir_vg n_vg < <(ir_total "$dir/valgrind")
    read -r ir_cs n_cs < <(ir_total "$dir/cachescope")
    printf '%s\t' "$name" "${best_t[native]}" "${best_t[valgrind]}" "${best_t[cachescope]}" \
        "${best_m[native]}" "${best_m[valgrind]}" "${best_m[cachescope]}" \
        "$ir_vg" "$n_vg" "$ir_cs" "$n_cs" >>"$work/results"
    printf '%s\t%s\n' "$status" "${best_t[counting]:--}" >>"$work/results"

    if [[ $stats == yes ]]; then
        local out=$keep/stats.$name.txt
        (cd "$dir" && rm -rf stats && mkdir stats && cd stats &&
            "$cachescope" --stats=yes --cache-sim=no "--trace-children=$trace" \
                "--cachegrind-out-file=$dir/stats/cachegrind.out.%p" "${cmd[@]}" \
                >/dev/null 2>"$out") || echo "engine.sh: $name: the --stats=yes run failed" >&2
        echo "  $name: cachescope --stats=yes stderr in $out"
    fi
}

: >"$work/results"
for w in "${selected[@]}"; do
    echo "$w ..."
    rows=$(wc -l <"$work/results")
    # A subshell with errexit of its own: a failing step ends this workload
    # only. (Inside `if` or `||` bash would ignore errexit in the subshell.)
    set +e
    (
        set -eE
        trap 'echo "engine.sh: $w: \"$BASH_COMMAND\" failed (exit status $?)" >&2' ERR
        run_workload "$w"
    )
    rc=$?
    set -e
    if [[ $(wc -l <"$work/results") == "$rows" ]]; then
        failed_row "$w" "FAILED (script error, exit status $rc)"
    fi
done

echo
awk -F'\t' -v counting="${runners[3]:-}" '
function ratio(a, b) { if (a == "-" || b == "-") return "-"; return sprintf("%.1fx", a / (b > 0 ? b : 0.01)) }
function mb(k) { return k == "-" ? "-" : sprintf("%.0f", k / 1024) }
function ir(v, n,   s) {
    if (v == "-") return "-"
    for (s = ""; length(v) > 3; v = substr(v, 1, length(v) - 3)) s = "," substr(v, length(v) - 2) s
    return v s " (" n ")"
}
function dir(v, c) { return (v == "-" || v == 0) ? "-" : sprintf("%+.2f%%", 100 * (c - v) / v) }
function bound(c, n) { return (c == "-" || n == "-") ? "-" : ratio(c, n) (c <= 2 * n ? " ok" : " NO") }
function row(a, b, c, d, e, f, g, h, i, j, k, l, m,   s) {
    s = sprintf("%-13s %8s %9s %8s %7s %7s  %-14s %19s %19s %8s", a, b, c, d, e, f, g, h, i, j)
    if (counting != "") s = s sprintf(" %8s %9s", l, m)
    s = s "  " k
    sub(/ +$/, "", s)
    print s
}
BEGIN {
    row("", "wall s", "", "", "cs/", "vg/", "peak mem MB", "Ir", "Ir", "Ir", "", "counting", "cs/")
    row("workload", "native", "valgrind", "cachesc.", "native", "cs", "nat/vg/cs", "valgrind", "cachescope",
        "cs-vg", "status", "wall s", "counting")
}
{
    row($1, $2, $3, $4, ratio($4, $2), ratio($3, $4), mb($5) "/" mb($6) "/" mb($7), ir($8, $9),
        ir($10, $11), dir($8, $10), $12, $13, bound($4, $13))
}' "$work/results"
echo "(Ir: summed over all profiles of the last run, number of profiles in brackets)"
[[ -z ${runners[3]:-} ]] ||
    echo "(counting: cachescope --tool=cachegrind --cache-sim=no, interleaved with the others; cs/counting: issue 11's bound is 2x)"
[[ -z ${BENCH_RESULTS:-} ]] || cp "$work/results" "$BENCH_RESULTS"

if awk -F'\t' '$12 != "ok" { bad = 1 } END { exit !bad }' "$work/results"; then
    echo "engine.sh: some workloads MISMATCH or FAILED (see above)" >&2
    exit 1
fi
