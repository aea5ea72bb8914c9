"""Record the demo replay data set through the service's own recording path.

Starts a vLLM CPU engine on the demo model, builds the service in-process with recording on (a
temporary SQLite store), sends every generated problem as an ordinary chat request with a fixed
policy of ``--samples`` samples (one ``n=k`` call each), the gold answer as ``ttc.reference`` and
log-probs on with the top ``--top-k`` alternatives per token (so each sample's token-confidence trace
is recorded, what ``deepconf`` replays from), then exports the recordings in the replay schema
(``ttc export``'s code path) and adds each problem's difficulty level to ``meta``.

    .venv/bin/python scripts/record_demo_data.py --problems 500 --samples 64 --out data/demo-arith-n64.jsonl

``--thinking`` records the reasoning demo model instead (``models/arith-thinker``, started as ``make
serve`` starts it: vLLM's qwen3 reasoning parser, a 2,048-token context) on the problems of its levels
1-8 (:mod:`ttc_tools.demo.thinking`); each sample's token count and confidence trace then cover its
thought and its answer (``make demo-thinking-data``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import httpx
from rich.progress import Progress

from app.backends.launcher import EmbeddedEngine
from app.config import REPO_ROOT, EngineConfig, Settings, bundled_engines
from app.main import create_app
from app.recording import export_jsonl
from ttc_tools.demo import thinking
from ttc_tools.demo.problems import LEVELS, generate


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=500)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="per sample (default: 192, or the thinking model's default, 1900)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--top-k", type=int, default=5, help="top log-probs per token (deepconf's top_k)")
    ap.add_argument("--model-dir", type=Path, default=REPO_ROOT / "models" / "arith-llama")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "data" / "demo-arith-n64.jsonl")
    ap.add_argument("--thinking", action="store_true", help="the reasoning demo model on its levels 1-8")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    cfg = EngineConfig(model_dir=args.model_dir)
    levels, draw = sorted(LEVELS), generate
    if args.thinking:
        cfg = next(e for e in bundled_engines() if e.served_model_name == "arith-thinker")
        levels, draw = sorted(thinking.LEVELS), thinking.generate
    args.max_tokens = args.max_tokens or cfg.default_max_tokens or 192
    problems = [draw(levels[i % len(levels)], rng) for i in range(args.problems)]
    level_of = {p.question: p.level for p in problems}

    engine = EmbeddedEngine(cfg, log_path=REPO_ROOT / ".logs" / "record-vllm.log")
    engine.start()
    try:
        await engine.wait_ready()
        with tempfile.TemporaryDirectory() as tmp:
            settings = Settings(
                backends=[{"url": engine.url, "name": "vllm-cpu"}], default_model=cfg.served_model_name,
                store={"url": f"sqlite+aiosqlite:///{tmp}/record.db"},
                recording={"enabled": True, "store_texts": False},
                limits={"max_samples": max(64, args.samples)},
                pool={"health_interval_s": 60.0},  # the engine is busy on purpose: its calls say whether it is up
            )
            app = create_app(settings)
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=600) as client:
                    await run_requests(client, problems, args)
                state = app.state.ttc
                await state.recorder.flush()
                n = await export_jsonl(state.store, args.out)
        rows = [json.loads(line) for line in args.out.read_text().splitlines()]
        rows.sort(key=lambda r: (level_of.get(r["question"], 0), r["question"]))
        for i, row in enumerate(rows):
            row["id"] = f"arith-{i:04d}"
            row["meta"] = {**row["meta"], "level": level_of.get(row["question"]),
                           "dataset": "demo-arith-thinking" if args.thinking else "demo-arith",
                           "temperature": args.temperature, "licence": "generated; same licence as this project"}
            row["meta"].pop("request_id", None)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {n} problems x {args.samples} samples to {args.out}")
    finally:
        engine.stop()


async def run_requests(client: httpx.AsyncClient, problems: list, args: argparse.Namespace) -> None:
    sem = asyncio.Semaphore(args.concurrency)
    started = time.perf_counter()
    with Progress() as progress:
        task = progress.add_task("recording", total=len(problems))

        async def one(p) -> None:  # type: ignore[no-untyped-def]
            body = {
                "messages": [{"role": "user", "content": p.question}], "temperature": args.temperature,
                "max_tokens": args.max_tokens, "logprobs": True, "top_logprobs": args.top_k,
                "ttc": {"policy": {"allocator": "fixed", "params": {"n": args.samples}}, "reference": str(p.gold)},
            }
            async with sem:
                for _ in range(30):  # a busy machine can fail health checks: the backend is back after its cooldown
                    resp = await client.post("/v1/chat/completions", json=body)
                    if resp.status_code != 503:
                        break
                    await asyncio.sleep(5)
            resp.raise_for_status()
            progress.advance(task)

        await asyncio.gather(*(one(p) for p in problems))
    print(f"{len(problems)} requests in {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    asyncio.run(main())
