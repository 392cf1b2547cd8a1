#!/usr/bin/env bash
# Proof of no flakes: the full suite (`make test`) N times on a fresh clone of this checkout's
# HEAD, with a CPU hog beside it (one busy process per core, at the suite's own priority), and
# a table: run, minutes, passed, failed, and the tests that failed.
#
#   tests/flakes.sh [N]        (default 5; logs and the table in the folder it prints)
set -u
runs=${1:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/mpips-flakes-XXXXXX")
git clone --quiet "$here" "$work/mpips" || exit 2
cd "$work/mpips" || exit 2
echo "fresh clone of $(git rev-parse --short HEAD) in $work/mpips; logs in $work"

hogs=()
for _ in $(seq "$(nproc)"); do
    sh -c 'while :; do :; done' &
    hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
echo "CPU hog: ${#hogs[@]} busy process(es), one per core"

# Sums a count ("3 passed", "1 failed", "2 errors") over the pytest sessions of a log.
count() { grep -aoE "[0-9]+ $2" "$1" | awk '{ n += $1 } END { print n + 0 }'; }

table="$work/table.txt"
printf '%-4s %8s %8s %7s  %s\n' run minutes passed failed "failed tests" > "$table"
bad=0
for run in $(seq "$runs"); do
    log="$work/run-$run.log"
    began=$SECONDS
    make test > "$log" 2>&1
    status=$?
    minutes=$(awk -v t=$((SECONDS - began)) 'BEGIN { printf "%.1f", t / 60 }')
    passed=$(count "$log" "passed")
    failed=$(( $(count "$log" "failed") + $(count "$log" "errors?") ))
    names=$(grep -aE '^(FAILED|ERROR) ' "$log" | sed -E 's/^(FAILED|ERROR) //; s/ - .*//' \
            | sort -u | tr '\n' ' ')
    if [ "$status" -ne 0 ] && [ -z "$names" ]; then
        names="make test exited $status: $(grep -a '^FAILED:' "$log" | tail -1)"
        failed=$((failed > 0 ? failed : 1))
    fi
    [ "$failed" -gt 0 ] && bad=$((bad + 1))
    printf '%-4s %8s %8s %7s  %s\n' "$run" "$minutes" "$passed" "$failed" "${names:--}" >> "$table"
    tail -1 "$table"
done
echo
cat "$table"
echo "$bad of $runs run(s) had a failure (table: $table)"
[ "$bad" -eq 0 ]
