#!/usr/bin/env python3
"""Restart or catch-up timing on a kept bench-scale directory.

    scripts/bench/kept-restart.py DIR restart|catchup [BINDIR]

DIR is a cluster directory `make bench-scale` kept (IDA_KEEP_TEST_DIRS=1:
cluster.conf, data/, tls/). Its data and certificates are copied to
/tmp/ida-kept-restart once (FRESH=1 copies again; a catch-up wipes a node of
the copy), the three nodes are started from BINDIR (default bin/), and once
they all applied the same index (plus SETTLE seconds, default 5) one
follower is killed with SIGKILL and started again: as it was (restart) or
with its data directory removed (catchup: auto_rejoin re-admits it and the
leader sends its snapshot). Prints the milliseconds until the node's status
shows the leader's commit of before the kill, and that node's own log lines
for the restore, the rebuild, the snapshot check and the install; for a
catch-up also the time from the learner's admission to the install and from
the install to caught up (the replay of the log after the snapshot). WRAP="perf
record -g --" runs the restarted node under a wrapper; LEADER=N has node N
lead first (each node snapshots at its own indexes, so which node leads
decides the snapshot sent and the log after it). Every node is stopped
at the end. Same measurement as bench-scale's restart and catch-up, repeated
on one state without the ten minutes of filling it; needs python3."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

if len(sys.argv) < 3 or sys.argv[2] not in ("restart", "catchup"):
    sys.exit(__doc__)
src, mode = sys.argv[1], sys.argv[2]
bindir = sys.argv[3] if len(sys.argv) > 3 else "bin"
W = "/tmp/ida-kept-restart"
conf_path = W + "/cluster.conf"

if not os.path.exists(W + "/.copied") or os.environ.get("FRESH"):
    shutil.rmtree(W, ignore_errors=True)
    os.makedirs(W)
    subprocess.run(["cp", "-a", src + "/data", src + "/tls", W], check=True)
    open(W + "/.copied", "w").close()
with open(src + "/cluster.conf") as f:
    lines = [("data_dir " + W + "/data\n") if l.startswith("data_dir") else l
             for l in f]
with open(conf_path, "w") as f:
    f.writelines(lines)

procs = {}


def start(i, wrap=()):
    log = open(f"{W}/node{i}.log", "a")
    procs[i] = subprocess.Popen(
        list(wrap) + [bindir + "/idallocd", "--config", conf_path,
                      "--node", str(i)],
        stdout=log, stderr=subprocess.STDOUT)


def status():
    r = subprocess.run([bindir + "/idalloc", "--config", conf_path,
                        "--timeout", "300", "status", "--json"],
                       capture_output=True, text=True)
    try:
        return json.loads(r.stdout)["nodes"]
    except (ValueError, KeyError):
        return []


def cpu_s(i):
    """CPU seconds (user + system) node @i used so far."""
    try:
        with open(f"/proc/{procs[i].pid}/stat") as fs:
            f = fs.read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def stop_all():
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs.values():
        p.wait()


try:
    for i in (1, 2, 3):
        start(i)
    t = time.time()
    while True:
        ns = [n for n in status() if "applied" in n]
        if len(ns) == 3 and len({n["applied"] for n in ns}) == 1 and \
                any(n.get("role") == "leader" for n in ns):
            break
        if time.time() - t > 120:
            sys.exit("the cluster did not settle in 120 s")
        time.sleep(0.2)
    want = os.environ.get("LEADER")
    if want:
        # The same leader every run: each node snapshots at indexes of its
        # own, so the snapshot sent and the log after it depend on it.
        for _ in range(50):
            ls = [n["node"] for n in status() if n.get("role") == "leader"]
            if ls and str(ls[0]) == want:
                break
            subprocess.run([bindir + "/idalloc", "--config", conf_path,
                            "leader", "transfer", "--to", want],
                           capture_output=True)
            time.sleep(0.5)
    time.sleep(float(os.environ.get("SETTLE", "5")))
    ns = status()
    leader = [n for n in ns if n.get("role") == "leader"][0]
    f = [n for n in ns if n.get("role") != "leader"][0]["node"]
    commit = leader["commit"]
    cpu0 = {i: cpu_s(i) for i in procs if i != f}
    procs[f].send_signal(signal.SIGKILL)
    procs[f].wait()
    if mode == "catchup":
        shutil.rmtree(f"{W}/data/node{f}")
        os.replace(f"{W}/node{f}.log", f"{W}/node{f}.log.old")
    t0 = time.time()
    start(f, os.environ.get("WRAP", "").split())
    while True:
        n = [x for x in status() if x.get("node") == f]
        if n and n[0].get("applied", 0) >= commit:
            break
        if time.time() - t0 > 300:
            sys.exit(f"node {f} did not reach commit {commit} in 300 s")
        time.sleep(0.01)
    t_done = time.time()
    print(f"{mode}: node {f} applied the leader's commit {commit} after "
          f"{(t_done - t0) * 1000:.0f} ms")
    print("  CPU meanwhile: " + ", ".join(
        f"node {i}{' (leader)' if i == leader['node'] else ''} "
        f"{cpu_s(i) - cpu0.get(i, 0.0):.2f} s" for i in sorted(procs)))
    with open(f"{W}/node{f}.log") as fl:
        log = fl.read().splitlines()
    if mode == "catchup":
        def stamp(line):
            h, m, sec = line[11:23].split(":")
            return (int(h) * 60 + int(m)) * 60 + float(sec)
        with open(f"{W}/node{leader['node']}.log") as fl:
            added = [stamp(l) for l in fl if "voters, 1 learners" in l]
        inst = [stamp(l) for l in log if "fsm: installed snapshot" in l]
        if added and inst:
            print(f"  learner added -> installed: "
                  f"{(inst[-1] - added[-1]) * 1000:.0f} ms")
        snaps = [int(m.group(1)) for l in log
                 for m in [re.search(r"installed snapshot at index (\d+)", l)]
                 if m]
        if inst and snaps:
            # The logs' clocks are UTC time of day, as time.time() is.
            print(f"  installed -> caught up (replay of "
                  f"{max(commit - snaps[-1], 0)} entries): "
                  f"{((t_done % 86400) - inst[-1]) * 1000:.0f} ms")
    first = max(i for i, l in enumerate(log)
                if re.search(r"storage .*: node \d+ incarnation", l))
    for l in log[first:]:
        if any(k in l for k in ("restored term", "state rebuilt", "checked in",
                                "installed snapshot", "fsm: applied entries")):
            print("  " + l)
finally:
    stop_all()
