"""The scale-out topology as processes on this machine: N ``ttc serve`` replicas behind HAProxy, sharing
one PostgreSQL store and one Redis, in front of M backends (``ttc fake-backend``, or vLLM CPU servers
on the bundled demo model). The same shape as ``docker compose --profile scale up``, without Docker.
Everything is on loopback, on free ports, in one temporary folder, and stopped on exit.

Start it and keep it up until Ctrl-C (prints every URL: the load balancer, each replica and its
/metrics, HAProxy's statistics, Postgres, Redis, the backends)::

    python scripts/scale_local.py --replicas 2 --backends 1 --token-latency-ms 5

Measure 1 vs 2 replicas: ``--compare 1,2`` starts the topology once with the largest count, warms it
up, then runs ``ttc loadtest`` (closed loop, ``--concurrency`` clients for ``--duration`` seconds)
against the load balancer with the first k replicas in rotation (the others set to maintenance in
HAProxy, so they take no traffic), for each count, ``--repeat`` times interleaved; prints requests/s,
p50/p99 latency, errors and how the load balancer split the requests::

    python scripts/scale_local.py --compare 1,2 --duration 20 --concurrency 16 --repeat 2

Measure batch takeover: ``--takeover N`` runs N trials on two replicas: a background batch is sent to
one replica, which is SIGKILLed at a random moment (``--kill-within-s`` after its first 10 samples are
checkpointed); the other takes it
over when the lease (``--lease-s``) runs out. Prints, per trial, the takeover time after the kill, the
samples lost (finished by the backend but never checkpointed: still in transit, or not yet written,
when the replica died; their slots are drawn again and not billed) and the samples drawn against the
budget; the killed replica is restarted for the next trial. The fake backend finishes every sample
of a call at the same token step, so a kill can land in a burst of finishes (the worst case)::

    python scripts/scale_local.py --takeover 5 --token-latency-ms 50

Needs postgresql, redis-server and haproxy (``scripts/test-services.sh`` installs them); ``--backend
vllm`` needs ``make vllm-venv``. On a small machine every process here shares the same cores: the
replicas only help when the service itself, not the backend or the load generator, is what is short
of CPU.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ttc_tools.bench.procs import children, cpu_seconds, ttc_exe  # noqa: E402
from ttc_tools.bench.topology import MissingBinary, Topology  # noqa: E402


def served(url: str) -> float:
    """Requests this replica answered, all outcomes (``ttc_requests_total``)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r"^ttc_requests_total\{[^}]*\} (\S+)", text, re.M))


def loadtest(topo: Topology, args: argparse.Namespace, out: Path, duration: float) -> dict[str, Any]:
    """One ``ttc loadtest`` run against the load balancer; its summary row."""
    cmd = [ttc_exe(), "loadtest", "--url", topo.url, "--concurrency", str(args.concurrency),
           "--duration", str(duration), "--timeout", "60", "--out", str(out)]
    cmd += ["--policy-spec", args.policy_spec, "--policy", ""] if args.policy_spec else ["--policy", args.policy]
    if args.data:
        cmd += ["--data", str(args.data)]
    with open(out.with_suffix(".log"), "wb") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=out.parent)
    levels = json.loads((out / "summary.json").read_text())["levels"]
    assert len(levels) == 1, levels
    return dict(levels[0])


def cpu(topo: Topology) -> dict[str, float]:
    """CPU seconds used so far by each part: the replicas (with their answer workers), the backends,
    HAProxy, and the load generator (finished ``ttc loadtest`` runs: this process's reaped children)."""
    def tree(pid: int) -> float:
        return cpu_seconds(pid) + sum(tree(child) for child, _ in children(pid))

    assert topo.lb.proc is not None
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"replicas": sum(tree(r.pid) for r in topo.replicas), "backends": sum(tree(b.pid) for b in topo.backends),
            "haproxy": tree(topo.lb.proc.pid), "loadgen": kids.ru_utime + kids.ru_stime}


def compare(topo: Topology, counts: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    names = topo.lb.names
    assert topo.root is not None
    work = topo.root / "loadtest"  # reports and logs of every run (kept with --workdir)
    work.mkdir()
    print(f"warm-up: {args.warmup:g} s on all {len(names)} replicas ...", flush=True)
    loadtest(topo, args, work / "warmup", args.warmup)
    rows = []
    for rep in range(args.repeat):
        for k in counts:
            for i, name in enumerate(names):
                topo.lb.set_state(name, "ready" if i < k else "maint")
            topo.lb.wait_status("UP", names[:k])
            before = [served(r.url) for r in topo.replicas]
            cpu_before = cpu(topo)
            print(f"run {rep + 1}/{args.repeat}: {k} replica(s), {args.concurrency} clients, {args.duration:g} s ...",
                  flush=True)
            row = loadtest(topo, args, work / f"r{rep}-k{k}", args.duration)
            split = [int(served(r.url) - b) for r, b in zip(topo.replicas, before, strict=True)]
            cpu_after = cpu(topo)
            used = {part: round(cpu_after[part] - cpu_before[part], 1) for part in cpu_before}
            rows.append({"replicas": k, "run": rep + 1, "requests": row["requests"], "ok": row["ok"],
                         "failed": row["failed"], "rps": row["throughput_rps"], "p50_ms": row["latency_p50_ms"],
                         "p99_ms": row["latency_p99_ms"], "samples_per_query": row["samples_per_query"],
                         "errors": row["errors"], "split": split, "cpu_s": used})
    for name in names:
        topo.lb.set_state(name, "ready")
    return rows


def until(what: str, check: Any, timeout: float = 300) -> None:
    """Poll ``check()`` (an HTTP read) until it holds; fail after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def takeover(topo: Topology, trials: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--takeover``: see the module doc. The batch: 40 prompts, 200 samples, ``uniform``, stream."""
    fake = topo.backends[0].url + "/fake/stats"
    body = {"prompts": [f"Question {i}: p_correct=0.6 {20 + i}" for i in range(40)], "budget": {"total_samples": 200},
            "policy": {"allocator": "uniform"}, "schedule": "stream", "background": True}
    rng = random.Random(args.seed)
    rows = []
    for trial in range(trials):
        a, b = topo.replicas[trial % 2], topo.replicas[(trial + 1) % 2]
        before = httpx.get(fake, timeout=10).json()
        job = httpx.post(a.url + "/v1/ttc/batches", json=body, timeout=30).json()["id"]

        def view(job: str = job, b: Any = b) -> dict[str, Any]:
            return dict(httpx.get(f"{b.url}/v1/ttc/batches/{job}", timeout=10).json())

        until("the first samples to be checkpointed", lambda: view()["progress"]["samples_drawn"] >= 10)
        time.sleep(rng.uniform(0, args.kill_within_s))  # the kill lands at a random moment, not at a checkpoint
        a.kill()
        killed = time.monotonic()
        at_kill = view()["progress"]["samples_drawn"]
        until("the takeover", lambda: view()["takeovers"] >= 1, timeout=args.lease_s * 3 + 60)
        took = time.monotonic() - killed
        until("the batch to complete", lambda: view()["status"] == "completed")
        drawn = view()["summary"]["samples_drawn"]
        after = httpx.get(fake, timeout=10).json()
        finished = after["samples_finished"] - before["samples_finished"]
        rows.append({"trial": trial + 1, "checkpointed_at_kill": at_kill, "takeover_s": round(took, 2),
                     "lost": finished - drawn, "drawn": drawn, "budget": 200,
                     "cut_by_kill": after["samples_cancelled"] - before["samples_cancelled"]})
        print(f"trial {trial + 1}: killed with {at_kill} checkpointed, taken over after {took:.2f} s, "
              f"{finished - drawn} lost, {drawn}/200 drawn", flush=True)
        a.start().wait_ready()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'replicas':>8} {'run':>3} {'requests':>8} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6}  "
            f"{'split':<11}  CPU s: replicas/backends/haproxy/loadgen")
    lines = [head]
    for r in rows:
        c = r["cpu_s"]
        lines.append(f"{r['replicas']:>8} {r['run']:>3} {r['requests']:>8} {r['rps']:>7.1f} {r['p50_ms']:>7.0f} "
                     f"{r['p99_ms']:>7.0f} {r['failed']:>6}  {'/'.join(map(str, r['split'])):<11}  "
                     f"{c['replicas']}/{c['backends']}/{c['haproxy']}/{c['loadgen']}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=2, help="ttc serve replicas behind the load balancer (default 2)")
    p.add_argument("--backends", type=int, default=1, help="backend servers every replica uses (default 1)")
    p.add_argument("--backend", choices=("fake", "vllm"), default="fake",
                   help="fake: ttc fake-backend (default); vllm: vLLM CPU on the demo model (make vllm-venv)")
    p.add_argument("--latency-ms", type=float, default=20.0, help="fake backend: latency of every call (default 20)")
    p.add_argument("--token-latency-ms", type=float, default=0.0,
                   help="fake backend: time between streamed tokens (default 0)")
    p.add_argument("--p-correct", type=float, default=None, help="fake backend: chance a sample is right")
    p.add_argument("--workdir", type=Path, default=None,
                   help="keep configs, data and logs in this (new or empty) folder instead of a temporary one")
    p.add_argument("--compare", default=None, metavar="K1,K2",
                   help="measure instead of serving: load runs with K1, K2, ... replicas in rotation (e.g. 1,2)")
    p.add_argument("--concurrency", type=int, default=16, help="--compare: closed-loop clients (default 16)")
    p.add_argument("--duration", type=float, default=20.0, help="--compare: seconds per run (default 20)")
    p.add_argument("--warmup", type=float, default=5.0, help="--compare: seconds of warm-up load (default 5)")
    p.add_argument("--repeat", type=int, default=1, help="--compare: interleaved rounds of runs (default 1)")
    p.add_argument("--policy", default="self-consistency-8", help="--compare: policy of every request")
    p.add_argument("--policy-spec", default=None, metavar="LABEL=JSON",
                   help='--compare: an inline policy instead, e.g. fixed32=\'{"allocator":"fixed","params":{"n":32}}\'')
    p.add_argument("--data", type=Path, default=None, help="--compare: problem file (default: ttc loadtest's)")
    p.add_argument("--json", type=Path, default=None, help="--compare / --takeover: also write the rows here")
    p.add_argument("--takeover", type=int, default=0, metavar="N",
                   help="measure instead of serving: N SIGKILL-and-takeover trials of a background batch")
    p.add_argument("--lease-s", type=float, default=2.0, help="--takeover: the replicas' batches.lease_s (default 2)")
    p.add_argument("--seed", type=int, default=0, help="--takeover: seed of the random kill points")
    p.add_argument("--kill-within-s", type=float, default=1.5,
                   help="--takeover: the kill comes up to this long after the first 10 samples (default 1.5)")
    args = p.parse_args()
    counts = [int(x) for x in args.compare.split(",")] if args.compare else []
    if any(k < 1 for k in counts):
        p.error("--compare wants replica counts of at least 1")
    replicas = max([args.replicas, *counts]) if counts else args.replicas
    if args.takeover:
        replicas = 2
    print(f"starting {replicas} replica(s), {args.backends} {args.backend} backend(s), postgres, redis, haproxy ...",
          flush=True)
    try:
        config = {"batches": {"lease_s": args.lease_s}} if args.takeover else None
        with Topology(replicas, args.backends, args.backend, latency_ms=args.latency_ms,
                      token_latency_ms=args.token_latency_ms, p_correct=args.p_correct, workdir=args.workdir,
                      config=config) as topo:
            print(topo.describe(), flush=True)
            if args.takeover:
                rows = takeover(topo, args.takeover, args)
                took = sorted(r["takeover_s"] for r in rows)
                print(f"\n{len(rows)} takeovers (lease {args.lease_s:g} s): takeover {took[0]:.2f}-{took[-1]:.2f} s, "
                      f"median {took[len(took) // 2]:.2f} s; samples lost per trial: "
                      f"{', '.join(str(r['lost']) for r in rows)}; over budget: "
                      f"{sum(r['drawn'] > r['budget'] for r in rows)} trial(s)")
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=2))
                return 0
            if counts:
                rows = compare(topo, counts, args)
                print(f"\n{args.policy_spec or args.policy}, {args.concurrency} clients, {args.duration:g} s per run, {args.backends} "
                      f"{args.backend} backend(s) (latency {args.latency_ms:g} ms), through haproxy:")
                print(table(rows))
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=2))
                return 0
            print("\nup; Ctrl-C stops everything", flush=True)
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            reported: set[int] = set()
            try:
                while not stop.wait(1):
                    for i, r in enumerate(topo.replicas):
                        if i not in reported and r.proc is not None and r.proc.poll() is not None:
                            reported.add(i)
                            print(f"replica r{i + 1} ({r.url}) exited with {r.proc.returncode}; the load balancer "
                                  "routes around it", flush=True)
            except KeyboardInterrupt:
                pass
            print("stopping ...", flush=True)
    except MissingBinary as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
