#!/bin/bash
# (The team's yardstick, kept here so `make bench` can run it: make bench-etcd.)
# Durable unique-id allocation, side by side on this machine, same disk, same run:
#   etcd 3.4 (Debian's etcd-server): 3 nodes on loopback, default durability; id = header.revision of a put,
#     driven by wrk through etcd's JSON gateway (wrk -t1/-t2, C connections, closed loop);
#   idalloc: 3 nodes from the project's cluster file format, `idalloc bench --op alloc` (tagged, durable).
# The two alternate per concurrency level so drifts of a shared machine hit both alike.
# Usage (from the project root, after `make`):
#   scripts/bench/vs-etcd.sh [-d SECONDS] [-c "1 16 64 256"] [-o OP] [-k KIND]
# Needs: apt-get install -y etcd-server etcd-client wrk   (installed here if missing and running as root)
# Prints one line per system and level, then "ratio c=N idalloc/etcd ops=R p50=R p99=R".
set -u
here=$(cd "$(dirname "$0")" && pwd)
proj=$(pwd); dur=10; levels="1 16 64 256"; op=alloc; kind=bounded
while getopts "d:c:o:k:p:" f; do case $f in d) dur=$OPTARG;; c) levels=$OPTARG;; o) op=$OPTARG;; k) kind=$OPTARG;; p) proj=$OPTARG;; *) exit 2;; esac; done
for b in etcd etcdctl wrk; do
  command -v $b >/dev/null && continue
  [ "$(id -u)" = 0 ] || { echo "missing $b: apt-get install -y etcd-server etcd-client wrk" >&2; exit 2; }
  apt-get install -y -qq etcd-server etcd-client wrk >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq etcd-server etcd-client wrk >/dev/null; } || exit 2
done
[ -x "$proj/bin/idallocd" ] && [ -x "$proj/bin/idalloc" ] || { echo "run make first (no bin/idallocd in $proj)" >&2; exit 2; }
work=$(mktemp -d /tmp/vs-etcd.XXXXXX); pids=()
cleanup() { for p in "${pids[@]:-}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# etcd
cp=(); pp=(); for i in 1 2 3; do cp[$i]=$(port); pp[$i]=$(port); done
ic="n1=http://127.0.0.1:${pp[1]},n2=http://127.0.0.1:${pp[2]},n3=http://127.0.0.1:${pp[3]}"
eps="http://127.0.0.1:${cp[1]},http://127.0.0.1:${cp[2]},http://127.0.0.1:${cp[3]}"
for i in 1 2 3; do
  etcd --name n$i --data-dir "$work/etcd$i" --listen-client-urls http://127.0.0.1:${cp[$i]} \
    --advertise-client-urls http://127.0.0.1:${cp[$i]} --listen-peer-urls http://127.0.0.1:${pp[$i]} \
    --initial-advertise-peer-urls http://127.0.0.1:${pp[$i]} --initial-cluster "$ic" \
    --initial-cluster-state new --initial-cluster-token vs >"$work/etcd$i.log" 2>&1 & pids+=($!)
done
for t in $(seq 1 100); do ETCDCTL_API=3 etcdctl --endpoints="$eps" endpoint health >/dev/null 2>&1 && break; sleep 0.2; done
EL=$(ETCDCTL_API=3 etcdctl --endpoints="$eps" endpoint status -w table 2>/dev/null | awk -F'|' '$6 ~ /true/ {gsub(/ /,"",$2); print $2}')
[ -n "$EL" ] || { echo "etcd did not elect a leader" >&2; exit 1; }
# idalloc
cfg=$work/ida.conf
{ echo "cluster vs"; for i in 1 2 3; do echo "node $i 127.0.0.1:$(port) 127.0.0.1:$(port)"; done; echo "data_dir $work/ida"; } >"$cfg"
# Peers use TLS where the project can make certificates (its default), unless IDA_PEER_TLS=off.
if "$proj/bin/idalloc" certs create "$work/certs" --nodes 3 >/dev/null 2>&1 && [ -f "$work/certs/ca.crt" ]; then
  if [ "${IDA_PEER_TLS:-on}" = off ]; then echo "peer_tls off" >>"$cfg"; else echo "tls_dir $work/certs" >>"$cfg"; fi
fi
for i in 1 2 3; do "$proj/bin/idallocd" --config "$cfg" --node $i >"$work/ida$i.log" 2>&1 & pids+=($!); done
IDA=("$proj/bin/idalloc" --config "$cfg")
for t in $(seq 1 50); do "${IDA[@]}" status 2>/dev/null | grep -q "role=leader" && break; sleep 0.2; done
size=(); [ "$kind" = bounded ] && size=(--size 1000000000)
"${IDA[@]}" pool create vs --kind "$kind" "${size[@]}" >/dev/null || { echo "idalloc pool create failed" >&2; exit 1; }
declare -A E I EP IP E9 I9
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); ${dur}s per point"
for c in $levels; do
  t=$([ "$c" = 1 ] && echo 1 || echo 2)
  out=$(cd "$here" && wrk -t$t -c$c -d${dur}s --timeout 10s -s etcd_put.lua "$EL" 2>&1 | grep '^RESULT')
  E[$c]=$(echo "$out" | sed 's/.*ok_per_s=\([0-9.]*\).*/\1/'); EP[$c]=$(echo "$out" | sed 's/.*p50_ms=\([0-9.]*\).*/\1/'); E9[$c]=$(echo "$out" | sed 's/.*p99_ms=\([0-9.]*\).*/\1/')
  echo "etcd    c=$c $out"
  line=$("${IDA[@]}" bench --op "$op" --pool vs --clients "$c" --duration "$dur" 2>/dev/null | tail -n 1)
  I[$c]=$(echo "$line" | sed 's/.*ops_per_s=\([0-9.]*\).*/\1/'); IP[$c]=$(echo "$line" | sed 's/.*p50_ms=\([0-9.]*\).*/\1/'); I9[$c]=$(echo "$line" | sed 's/.*p99_ms=\([0-9.]*\).*/\1/')
  echo "idalloc c=$c $line"
done
for c in $levels; do
  awk -v c="$c" -v e="${E[$c]}" -v i="${I[$c]}" -v ep="${EP[$c]}" -v ip="${IP[$c]}" -v e9="${E9[$c]}" -v i9="${I9[$c]}" \
    'BEGIN{printf "ratio c=%s idalloc/etcd ops=%.2f p50=%.2f p99=%.2f\n", c, i/e, ip/ep, i9/e9}'
done
