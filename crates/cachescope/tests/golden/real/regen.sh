#!/usr/bin/env bash
# Regenerates expected/ from Valgrind's Python tools (cg_annotate.in,
# cg_merge.in and cg_diff.in with @VERSION@ substituted), which are not part
# of this repository:
#
#     regen.sh DIR_WITH_cg_annotate_cg_merge_cg_diff
#
# Two crashes of those tools are patched out first, since cachescope
# deliberately does not reproduce them: cg_merge's `assert desc1` (inputs
# without `desc:` lines), and cg_annotate's decoding of source files as
# strict UTF-8 (bytes that are not UTF-8 are passed through instead).
# Each case runs in a scratch copy of this directory where every file has
# the same modification time, as the tests do.
set -euo pipefail
tools=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/tools"
sed 's/^\( *\)assert desc1$/\1pass/' "$tools/cg_merge" > "$work/tools/cg_merge"
sed 's/open(first_ofl, "r", encoding="utf-8")/open(first_ofl, "r", encoding="utf-8", errors="surrogateescape")/' \
    "$tools/cg_annotate" > "$work/tools/cg_annotate"
cp "$tools/cg_diff" "$work/tools/cg_diff"
grep -q 'errors="surrogateescape"' "$work/tools/cg_annotate"
grep -q '^ *pass$' "$work/tools/cg_merge"

while IFS=$'\t' read -r name env tool args; do
    case "$name" in ''|'#'*) continue ;; esac
    rm -rf "$work/case" && mkdir "$work/case"
    cp -r "$here"/. "$work/case/"
    find "$work/case" -type f -exec touch -d '2020-09-13 12:26:40' {} +
    IFS=$'\t' read -r -a argv <<< "$args"
    [ -z "$args" ] && argv=()
    code=0
    [ "$env" = - ] && env=
    (cd "$work/case" && env $env PYTHONIOENCODING=utf-8:surrogateescape python3 -c \
        'import sys; p = sys.argv[1]; sys.argv = sys.argv[2:]; exec(compile(open(p).read(), p, "exec"))' \
        "$work/tools/$tool" "$tool" "${argv[@]}" \
        > "$here/expected/$name.out" 2> "$here/expected/$name.err") || code=$?
    [ -s "$here/expected/$name.err" ] || rm "$here/expected/$name.err"
    if [ "$code" != 0 ]; then echo "$code" > "$here/expected/$name.code"; else rm -f "$here/expected/$name.code"; fi
    echo "$name: $code"
done < "$here/cases"
