#!/usr/bin/env bash
# Run the nodes of a cluster file in the foreground (make run, make node).
#
#   scripts/run-cluster.sh [CLUSTER_FILE]            every node of the file
#   scripts/run-cluster.sh --node ID [CLUSTER_FILE]  node ID alone (restart it)
#
# CLUSTER_FILE defaults to cluster-configs/local-3.conf. Node logs go to the
# terminal. Each node's pid is printed at start. A node that dies is reported
# (id, pid, exit status) with the command that brings it back; the others keep
# serving. Ctrl-C (SIGINT) or SIGTERM stops every node this script started and
# exits 0. $IDA_BINDIR (default bin) is where idallocd and idalloc are.
# When the cluster file has a `tls_dir DIR` line, the certificates the nodes
# need are created there on first start (`idalloc certs create DIR --nodes N
# --clients 1`, then `idalloc certs add DIR --node I` for a node id that has
# none yet); existing files are kept.
set -uo pipefail

usage() {
    cat <<'EOF'
usage: scripts/run-cluster.sh [--node ID] [CLUSTER_FILE]

Run every node of CLUSTER_FILE (default cluster-configs/local-3.conf) in the
foreground, or with --node ID only that node (to restart a node that died
while the others keep running). A node that dies is reported with the command
that restarts it; the others keep serving. Ctrl-C stops every node this
script started (exit 0).
EOF
}

conf=
only=
while [ $# -gt 0 ]; do
    case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        --node)
            if [ $# -lt 2 ]; then
                echo "run-cluster: --node needs a node id (see --help)" >&2
                exit 2
            fi
            only=$2
            shift 2
            ;;
        -*)
            echo "run-cluster: unknown option $1 (see --help)" >&2
            exit 2
            ;;
        *)
            if [ -n "$conf" ]; then
                echo "run-cluster: one cluster file only, got \"$conf\" and \"$1\" (see --help)" >&2
                exit 2
            fi
            conf=$1
            shift
            ;;
    esac
done
conf=${conf:-cluster-configs/local-3.conf}
bindir=${IDA_BINDIR:-bin}
if [ ! -r "$conf" ]; then
    echo "run-cluster: cannot read cluster file $conf" >&2
    exit 2
fi
if [ ! -x "$bindir/idallocd" ]; then
    echo "run-cluster: $bindir/idallocd is missing: run \`make programs\` first" >&2
    exit 2
fi
ids=$(awk '$1 == "node" { print $2 }' "$conf")
if [ -z "$ids" ]; then
    echo "run-cluster: no node lines in $conf" >&2
    exit 2
fi
if [ -n "$only" ]; then
    if ! grep -qx -- "$only" <<<"$ids"; then
        echo "run-cluster: no node $only in $conf (its nodes: $(echo $ids))" >&2
        exit 2
    fi
    ids=$only
fi

# Certificates: DIR of `tls_dir DIR` is relative to the cluster file.
tls_dir=$(awk '$1 == "tls_dir" { print $2; exit }' "$conf")
if [ -n "$tls_dir" ]; then
    case $tls_dir in
        /*) ;;
        *) tls_dir=$(dirname "$conf")/$tls_dir ;;
    esac
    if [ ! -x "$bindir/idalloc" ]; then
        echo "run-cluster: $bindir/idalloc is missing: run \`make programs\` first" >&2
        exit 2
    fi
    all_ids=$(awk '$1 == "node" { print $2 }' "$conf")
    if [ ! -e "$tls_dir/ca.crt" ]; then
        max=$(sort -n <<<"$all_ids" | tail -1)
        echo "run-cluster: creating a development CA and certificates in $tls_dir" >&2
        "$bindir/idalloc" certs create "$tls_dir" --nodes "$max" --clients 1 >&2 || exit 1
    fi
    for id in $all_ids; do
        if [ ! -e "$tls_dir/node$id.crt" ]; then
            "$bindir/idalloc" certs add "$tls_dir" --node "$id" >&2 || exit 1
        fi
    done
fi

declare -A pid_of # node id -> pid, for the nodes still running
stop() {
    trap - INT TERM
    if [ ${#pid_of[@]} -gt 0 ]; then
        echo "run-cluster: stopping node(s) ${!pid_of[*]} (pids ${pid_of[*]})" >&2
        kill -TERM "${pid_of[@]}" 2>/dev/null
    fi
    wait
    echo "run-cluster: stopped" >&2
    exit 0
}
trap stop INT TERM

for id in $ids; do
    "$bindir/idallocd" --config "$conf" --node "$id" &
    pid_of[$id]=$!
    echo "run-cluster: node $id pid $!" >&2
done
echo "run-cluster: started node(s) $(echo $ids) of $conf; Ctrl-C stops them" >&2

# How a node ended, from a wait status.
describe() {
    local st=$1
    if [ "$st" -gt 128 ]; then
        echo "killed by signal $(kill -l $((st - 128)) 2>/dev/null || echo $((st - 128))) (status $st)"
    else
        echo "exit status $st"
    fi
}

while [ ${#pid_of[@]} -gt 0 ]; do
    gone=
    wait -n -p gone "${pid_of[@]}"
    st=$?
    if [ -z "$gone" ]; then
        continue # a signal interrupted wait; its trap has run
    fi
    for id in "${!pid_of[@]}"; do
        if [ "${pid_of[$id]}" = "$gone" ]; then
            unset "pid_of[$id]"
            left=${#pid_of[@]}
            echo "run-cluster: node $id (pid $gone) exited: $(describe "$st");" \
                "$left node(s) of this script still running." >&2
            echo "run-cluster: to bring node $id back, run in another terminal:" \
                "scripts/run-cluster.sh --node $id $conf   (or: make node N=$id CONF=$conf)" >&2
        fi
    done
done
echo "run-cluster: no node of this script is running any more" >&2
exit 1
