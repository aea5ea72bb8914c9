"""What a plain OpenAI client pays: samples per request when requests carry no ``ttc`` block.

Starts ``ttc serve`` on the embedded vLLM engine and the demo model (an in-memory store, so the
built-in ``default`` policy applies), then drives it with third-party load generators that know
nothing of ``ttc``, and reads the service's own counters (``ttc_samples_drawn_total`` over
``ttc_requests_total``) before and after each:

* ``vllm bench serve`` (random prompts: answers cannot be extracted, so the policy gives up early);
* ``guidellm`` 0.3.1 on synthetic prompts, and on the demo model's own arithmetic questions.

guidellm is installed into ``.venv-guidellm`` on first use. Usage::

    python scripts/bench_plain_clients.py [--requests 100] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.backends.launcher import free_port  # noqa: E402
from ttc_tools.bench.procs import process, ttc_exe  # noqa: E402
from ttc_tools.demo.problems import make_set  # noqa: E402

GUIDELLM = ROOT / ".venv-guidellm" / "bin" / "guidellm"
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
MODEL = ROOT / "models" / "arith-llama"
_VBENCH = """
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
p = FlexibleArgumentParser(); add_cli_args(p)
main(p.parse_args({argv!r}))
"""


def counters(url: str) -> tuple[float, float]:
    """(samples drawn, requests answered) over every policy, from the service's /metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    samples = sum(float(v) for v in re.findall(r'^ttc_samples_drawn_total\{[^}]*\} (\S+)', text, re.M))
    ok = sum(float(v) for v in re.findall(r'^ttc_requests_total\{outcome="ok"[^}]*\} (\S+)', text, re.M))
    return samples, ok


def measured(url: str, label: str, cmd: list[str], env: dict[str, str] | None = None) -> dict[str, object]:
    s0, r0 = counters(url)
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=tempfile.gettempdir())
    wall = time.monotonic() - start
    s1, r1 = counters(url)
    if out.returncode != 0:
        raise SystemExit(f"{label} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    reqs = r1 - r0
    return {"client": label, "requests": int(reqs), "samples": int(s1 - s0),
            "samples_per_request": (s1 - s0) / reqs if reqs else None, "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    if not GUIDELLM.exists():
        subprocess.run([sys.executable, "-m", "venv", str(GUIDELLM.parent.parent)], check=True)
        subprocess.run([str(GUIDELLM.parent / "pip"), "install", "-q", "guidellm==0.3.1"], check=True)
    questions = Path(tempfile.mkdtemp()) / "demo-questions.jsonl"
    questions.write_text("".join(json.dumps({"prompt": p.question}) + "\n" for p in make_set(20, seed=7)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"TTC_STORE__URL": "sqlite+aiosqlite://"}
    with process([ttc_exe(), "serve", "--port", str(port), "--log-level", "warning"], url + "/ready",
                 timeout=900, env=env):
        n, c = str(args.requests), str(args.concurrency)
        vbench = ["--backend", "openai-chat", "--base-url", url, "--endpoint", "/v1/chat/completions",
                  "--model", "arith-llama", "--tokenizer", str(MODEL), "--dataset-name", "random",
                  "--random-input-len", "24", "--random-output-len", "32", "--num-prompts", n,
                  "--max-concurrency", c, "--seed", "0"]
        common = ["benchmark", "--target", url, "--model", "arith-llama", "--processor", str(MODEL),
                  "--rate-type", "concurrent", "--rate", c, "--max-requests", n, "--disable-progress",
                  "--output-path", str(questions.parent / "guidellm.json")]
        offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        rows = [
            measured(url, "vllm bench serve, random prompts", [str(VLLM_PY), "-c", _VBENCH.format(argv=vbench)],
                     offline),
            measured(url, "guidellm, synthetic prompts", [str(GUIDELLM), *common, "--data",
                                                          "prompt_tokens=24,output_tokens=32"], offline),
            measured(url, "guidellm, demo questions", [str(GUIDELLM), *common, "--data", str(questions),
                                                       "--backend-args", '{"max_output_tokens": 96}'], offline),
        ]
    print(f"{'client (wall s: the whole tool run)':<36} {'requests':>9} {'samples':>8} {'samples/request':>16} "
          f"{'wall s':>7}")
    for r in rows:
        spr = r["samples_per_request"]
        print(f"{r['client']:<36} {r['requests']:>9} {r['samples']:>8} "
              f"{(f'{spr:.2f}' if isinstance(spr, float) else '-'):>16} {r['wall_s']:>7.1f}")


if __name__ == "__main__":
    main()
