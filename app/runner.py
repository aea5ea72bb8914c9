"""The run service: every request that draws samples, single or batch, runs through :class:`Runner`.

Two thin adapters build a :class:`~app.prepare.RunSpec` through the one :class:`~app.prepare.Preparer`
(:mod:`app.serving` for the OpenAI routes, :mod:`app.batches` for batches); :meth:`Runner.run` then
owns everything around the engine call:

1. the engine loop (:meth:`app.engine.Engine.run`) with the request's queries, parts and limits;
2. metrics: outcome, samples drawn and saved against the policy's caps, rounds, stop reason, tokens,
   latency by route;
3. charging the key's samples-per-minute limit with what was drawn;
4. recording the served samples (when the policy is recorded);
5. feeding the run to a learning allocator: through the replicas' shared log (Redis), else locally;
6. one structured log line (``ttc.request``: id, route, policy, samples, rounds, stop reason,
   tokens, latency, outcome).

Failures are counted and logged the same way, then re-raised for the adapter to shape.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from app.engine import Engine, RoundCallback, RunResult
from app.errors import InvalidRequest
from app.metrics import Metrics
from app.prepare import RunSpec
from app.ratelimit import RateLimiter
from app.recording import Recorder
from app.shared_stats import SharedLearning

log = logging.getLogger("ttc.request")


class Runner:
    """Runs :class:`~app.prepare.RunSpec` s (see the module doc)."""

    def __init__(self, engine: Engine, metrics: Metrics, *, limiter: RateLimiter | None = None,
                 recorder: Recorder | None = None, shared: SharedLearning | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.limiter = limiter
        self.recorder = recorder
        self.shared = shared

    async def run(self, req: RunSpec, on_round: RoundCallback | None = None,
                  on_text: Callable[[str, bool], None] | None = None) -> RunResult:
        name = req.snapshot.name
        try:
            result = await self.engine.run(req.queries, req.parts, req.limits, seed=req.seed, on_round=on_round,
                                           on_text=on_text, resume=req.resume,
                                           owner=req.principal.key_id if req.principal else None)
        except BaseException as exc:
            outcome = str(getattr(exc, "code", None) or type(exc).__name__)
            self.metrics.requests.labels(name, outcome).inc()
            self._log(req, None, outcome)
            raise
        if result.samples_drawn == 0:  # nothing to answer with: the budget could not buy a sample
            error = InvalidRequest(
                f"The budget bought no sample ({req.limits.tokens} completion tokens under this policy, which "
                "estimates a sample's cost from its tokens_per_sample and the request's max_tokens): raise it, "
                "or lower max_tokens.", param=req.budget_param, code="budget_too_small")
            self.metrics.requests.labels(name, str(error.code)).inc()
            self._log(req, result, str(error.code))
            raise error
        latency = time.perf_counter() - req.started
        self._count(req, result, latency)
        who = req.principal
        if who is not None and self.limiter is not None:
            await self.limiter.charge_samples(who, result.samples_drawn)
        if self.recorder is not None:
            self.recorder.submit_run(req.snapshot, req.model, req.id, result, latency,
                                     key_id=who.key_id if who else None)
        if req.parts.learns:  # with Redis only through the log, own runs included (exact across replicas)
            finished = [r.state for r in result.runs if r.state.samples]
            if self.shared is not None:
                await self.shared.learn(req.snapshot, req.parts.allocator, finished)
            elif finished:
                req.parts.allocator.learn(finished)
        self._log(req, result, "partial" if result.partial else "ok")
        return result

    def _count(self, req: RunSpec, result: RunResult, latency: float) -> None:
        m, name = self.metrics, req.snapshot.name
        series = m.policy(name)
        if result.partial:
            m.requests.labels(name, "partial").inc()
        else:
            series.ok.inc()
        series.samples.inc(result.samples_drawn)
        series.saved.inc(sum(max(0, req.parts.cap(r.query.cap) - r.state.spent) for r in result.runs))
        series.rounds.observe(result.rounds)
        if result.speculative:
            m.speculative.labels(name).inc(result.speculative)
        m.stop_reasons.labels(name, result.stop_reason).inc()
        series.prompt_tokens.inc(result.usage.prompt_tokens)
        series.completion_tokens.inc(result.usage.completion_tokens)
        m.request_latency.labels(req.route).observe(latency)

    def _log(self, req: RunSpec, result: RunResult | None, outcome: str) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        fields = {
            "request_id": req.id, "route": req.route, "policy": req.snapshot.name,
            "policy_version": req.snapshot.version, "model": req.model, "queries": len(req.queries),
            "outcome": outcome, "latency_ms": round((time.perf_counter() - req.started) * 1000, 2),
            "key_id": req.principal.key_id if req.principal else None,
        }
        if result is not None:
            fields.update(samples=result.samples_drawn, rounds=result.rounds, stop_reason=result.stop_reason,
                          prompt_tokens=result.usage.prompt_tokens,
                          completion_tokens=result.usage.completion_tokens)
        log.info(" ".join(f"{k}={v}" for k, v in fields.items() if v is not None), extra={"ttc": fields})
