#!/usr/bin/env bash
# Start every node of a cluster file in the foreground (make run); logs go
# to the terminal; Ctrl-C (or SIGTERM) stops all nodes cleanly.
set -uo pipefail
conf=${1:?usage: run-cluster.sh CLUSTER_FILE}
bindir=${IDA_BINDIR:-bin}
ids=$(awk '$1 == "node" { print $2 }' "$conf")
[ -n "$ids" ] || { echo "run-cluster: no node lines in $conf" >&2; exit 2; }
pids=()
stop() {
    trap - INT TERM
    echo "run-cluster: stopping nodes ${pids[*]}" >&2
    kill -TERM "${pids[@]}" 2>/dev/null
    wait
    exit 0
}
trap stop INT TERM
for id in $ids; do
    "$bindir/idallocd" --config "$conf" --node "$id" &
    pids+=($!)
done
echo "run-cluster: started nodes $ids of $conf (pids ${pids[*]}); Ctrl-C stops them" >&2
wait -n
echo "run-cluster: a node exited; stopping the others" >&2
stop
