#!/usr/bin/env bash
# Run test lanes side by side: tests/lanes.sh NAME CMD [NAME CMD ...]
# The last lane runs in the foreground (its output live); the others run in the
# background with their output kept, printed after it under their names. Exits 1 if any
# lane failed, naming each one that did. Used by `make test` and `make test-chaos`.
set -uo pipefail
[ $# -ge 2 ] && [ $(($# % 2)) = 0 ] || { echo "usage: $0 NAME CMD [NAME CMD ...]" >&2; exit 2; }
out=$(mktemp -d)
names=() pids=()
while [ $# -gt 2 ]; do
    names+=("$1")
    ( bash -c "$2" >"$out/${#names[@]}.log" 2>&1 ) &
    pids+=($!)
    shift 2
done
echo "gnomon: lane '$1' here; beside it: ${names[*]} (their output follows)"
bash -c "$2"
rc=$?
failed=()
[ $rc = 0 ] || failed+=("$1")
for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    lane_rc=$?
    echo "gnomon: lane '${names[$i]}' (exit $lane_rc):"
    cat "$out/$((i + 1)).log"
    [ $lane_rc = 0 ] || failed+=("${names[$i]}")
done
rm -rf "$out"
if [ ${#failed[@]} -gt 0 ]; then
    echo "gnomon: failed lanes: ${failed[*]}"
    exit 1
fi
