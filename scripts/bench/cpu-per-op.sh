#!/bin/bash
# CPU time per acknowledged operation, by process: a 3-node cluster on this
# machine (TLS peers unless IDA_PEER_TLS=off) and `idalloc bench`, with each
# process's user+system time read from /proc before and after the run.
# Usage (from the project root, after `make`):
#   scripts/bench/cpu-per-op.sh [-c CLIENTS] [-d SECONDS] [-o OP]
# Prints the bench line, then "cpu_us_per_op leader=.. follower=.. follower=..
# bench=.. total=..".
set -u
proj=$(pwd); dur=10; clients=256; op=alloc
while getopts "c:d:o:" f; do case $f in c) clients=$OPTARG;; d) dur=$OPTARG;; o) op=$OPTARG;; *) exit 2;; esac; done
[ -x "$proj/bin/idallocd" ] && [ -x "$proj/bin/idalloc" ] || { echo "run make first" >&2; exit 2; }
work=$(mktemp -d /tmp/cpu-per-op.XXXXXX); pids=()
cleanup() { for p in "${pids[@]:-}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cfg=$work/ida.conf
{ echo "cluster cpu"; for i in 1 2 3; do echo "node $i 127.0.0.1:$(port) 127.0.0.1:$(port)"; done; echo "data_dir $work/ida"; } >"$cfg"
if [ "${IDA_PEER_TLS:-on}" = off ]; then echo "peer_tls off" >>"$cfg"
else "$proj/bin/idalloc" certs create "$work/certs" --nodes 3 >/dev/null && echo "tls_dir $work/certs" >>"$cfg"; fi
for i in 1 2 3; do "$proj/bin/idallocd" --config "$cfg" --node $i >"$work/ida$i.log" 2>&1 & pids+=($!); done
IDA=("$proj/bin/idalloc" --config "$cfg")
for t in $(seq 1 50); do "${IDA[@]}" status 2>/dev/null | grep -q "role=leader" && break; sleep 0.2; done
kind=bounded; size=(--size 1000000000)
[ "$op" = reserve ] || [ "$op" = next ] && { kind=sequence; size=(); }
[ "$op" = prefix ] && { kind=prefix; size=(); }
"${IDA[@]}" pool create cpu --kind "$kind" "${size[@]}" >/dev/null || exit 1
leader=$("${IDA[@]}" status | awk '/role=leader/ {for(i=1;i<=NF;i++) if ($i ~ /^node=/) {sub("node=","",$i); print $i}}' | head -1)
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
declare -A b0
for i in 1 2 3; do b0[$i]=$(cpu "${pids[$((i-1))]}"); done
TIMEFORMAT='%U %S'
{ time "${IDA[@]}" bench --op "$op" --pool cpu --clients "$clients" --duration "$dur" >"$work/bench.out" 2>/dev/null; } 2>"$work/time.out"
line=$(tail -n 1 "$work/bench.out"); echo "$line"
ok=$(echo "$line" | sed 's/.* ok=\([0-9]*\).*/\1/')
[ -n "$ok" ] && [ "$ok" -gt 0 ] || { echo "no operations" >&2; exit 1; }
out="cpu_us_per_op"; total=0
for i in 1 2 3; do
  d=$(( $(cpu "${pids[$((i-1))]}") - ${b0[$i]} )); us=$(awk -v d="$d" -v t="$ticks" -v n="$ok" 'BEGIN{printf "%.1f", d/t*1e6/n}')
  role=follower; [ "$i" = "$leader" ] && role=leader; out+=" node$i($role)=$us"; total=$(awk -v a="$total" -v b="$us" 'BEGIN{print a+b}')
done
bus=$(awk -v n="$ok" '{printf "%.1f", ($1+$2)*1e6/n}' "$work/time.out")
total=$(awk -v a="$total" -v b="$bus" 'BEGIN{printf "%.1f", a+b}')
echo "$out bench=$bus total=$total (the machine: $(nproc) cores)"
