"""Step-level search against a process reward model (or the generator's own likelihood): the strategies
of policies with a ``search`` spec.

A solution grows one step at a time: a call continues a partial solution up to the next
``step_delimiter`` (:meth:`~app.run.Run.continuation`; ``n`` continuations of one partial solution are
one call, so they share its prefix), the policy's ``prm`` verifier scores the steps
(:meth:`~app.run.Run.step_scores`) -- or its ``likelihood`` verifier does, from the log-probs of each
step's own tokens (no model call; ``aggregate: min`` makes a partial solution's score the probability
of its least likely token) -- and the strategy decides which partial solutions grow. A
continuation that ends at the model's end token instead of the delimiter finishes its solution, which
joins the query as a sample with its score (the PRM's: the ``min``/``last``/``prod`` of its steps, the
verifier's ``aggregate``; the likelihood's: its score after its last step); the policy's aggregator
then selects among the finished solutions, as among samples (``best_of_n`` on the score, or a
``weighted_majority`` of their answers).

* :class:`BeamSearch` (``beam``): keep ``width / expand`` partial solutions; each step expands each one
  ``expand`` ways (the first step: ``width`` from the prompt) and keeps the best ``width / expand`` by
  their last step's score (distinct ones first), until ``width`` solutions are finished.
* :class:`DiverseBeams` (``dvts``, diverse verifier tree search): ``width / expand`` independent subtrees,
  each a beam of one expanded ``expand`` ways per step.
* :class:`ParticleFilter` (``particles``): ``width`` particles, each extended by one step per round;
  the unfinished ones are resampled (with the run's seeded RNG) in proportion to their last step's
  score, so promising partial solutions are copied and weak ones die out.

Budgets are the run's: every call holds ``n * step_tokens`` of the token budget while it runs and is
billed what it generated, the PRM's tokens are billed, a query finishes at most ``min(width, cap)``
solutions, and the deadline bounds every call. Each query of a batch is searched on its own, side by
side. The ``ttc`` block's ``search`` says what happened: steps, calls, PRM calls, beams kept.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from app.backends.base import Draw
from app.protocol import SearchSpec
from app.run import QueryRun, Run, derive_seed
from app.verifiers import LikelihoodVerifier

STOPS = ("deadline", "tokens", "cap", "policy")
"""Stop reasons of the searches of a run, the first that any query reached wins."""


async def each_query(run: Run, query: Callable[[QueryRun], Awaitable[str]]) -> str:
    """``query`` for every query of the run, side by side; the run's stop reason is the first of
    :data:`STOPS` that any of them reached."""
    reasons = await asyncio.gather(*(query(q) for q in run.runs))
    return min(reasons, key=STOPS.index) if reasons else "policy"


@dataclass(slots=True)
class Partial:
    """A partial solution: its steps, what they cost, the last step's score, (a subtree's) group, and
    ``whole``, its score were it finished now (the PRM's ``aggregate`` of its steps; the likelihood's
    score)."""

    steps: list[str] = field(default_factory=list)
    tokens: int = 0
    score: float = 1.0
    group: int = 0
    whole: float = 1.0

    def text(self, delimiter: str) -> str:
        """What a continuation continues: the steps, each ended by the delimiter."""
        return "".join(s + delimiter for s in self.steps)


@dataclass(slots=True)
class Tally:
    """What one query's search did (the ``ttc`` block's ``search``), and its seeded RNG."""

    method: str
    rng: random.Random
    steps: int = 0
    calls: int = 0
    prm_calls: int = 0
    kept: list[int] = field(default_factory=list)
    starved: bool = False
    """The token budget paid for fewer continuations than a step asked for (the search ran narrower)."""

    def as_dict(self) -> dict[str, object]:
        return {"method": self.method, "steps": self.steps, "calls": self.calls, "prm_calls": self.prm_calls,
                "kept": self.kept}


class StepSearch:
    """The shared loop (see the module doc); subclasses say how many continuations each partial
    solution gets and which ones are kept."""

    method = ""

    async def run(self, run: Run) -> str:
        spec = run.parts.search
        assert spec is not None
        return await each_query(run, lambda q: self.query(run, q, spec))

    async def query(self, run: Run, q: QueryRun, spec: SearchSpec) -> str:
        width = min(spec.width, q.query.cap)
        tally = Tally(self.method, random.Random(derive_seed(run.seed or 0, q.query.id, "search")))
        q.search = tally.as_dict()
        beams = self.start(width, spec)
        finished = 0
        for step in range(spec.max_steps):
            if run.deadline_passed():
                return "deadline"
            if not beams:  # every partial solution finished or died: the budget's doing when it narrowed them
                return "tokens" if tally.starved else "policy"
            try:
                grown = await self.grow(run, q, beams, spec, step, tally)
            except TimeoutError:  # the deadline cut the step's calls (billed what they may have cost)
                return "deadline"
            if grown is None:
                return "tokens"
            ended = [d.stop_reason != spec.step_delimiter or d.finish_reason != "stop" for _, d in grown]
            done = [g for g, e in zip(grown, ended, strict=True) if e]
            going = [p for (p, _), e in zip(grown, ended, strict=True) if not e]
            for p, draw in done[: width - finished]:
                await run.finish_sample(q, self.solution(p, draw, spec), p.whole)
                finished += 1
            beams = self.keep(tally.rng, going, width - finished, spec)
            tally.steps, tally.kept = step + 1, [*tally.kept, len(beams)]
            q.search = tally.as_dict()
            run.rounds = max(run.rounds, step + 1)
            await run.notify()
            if finished >= width:
                return "policy"
        return "cap"

    def start(self, width: int, spec: SearchSpec) -> list[Partial]:
        """The partial solutions of the first step (empty)."""
        return [Partial()]

    def fanout(self, beams: Sequence[Partial], width: int, spec: SearchSpec, step: int) -> list[int]:
        """Continuations per partial solution this step."""
        raise NotImplementedError

    async def grow(self, run: Run, q: QueryRun, beams: list[Partial], spec: SearchSpec, step: int,
                   tally: Tally) -> list[tuple[Partial, Draw]] | None:
        """One step: every partial solution continued ``fanout`` ways, each new partial solution scored
        by the PRM (its last step's score) or, with the ``likelihood`` verifier, by
        :meth:`~app.verifiers.likelihood.LikelihoodVerifier.extend` of its parent's score with the new
        step's token log-probs. ``None``: the token budget could not pay for any step."""
        ways = self.fanout(beams, max(1, spec.width), spec, step)
        calls = [run.generate(q, run.continuation(q, p.text(spec.step_delimiter), spec.step_delimiter), k,
                              spec.step_tokens, run.call_seed(q, f"step{step}:{i}"))
                 for i, (p, k) in enumerate(zip(beams, ways, strict=True)) if k > 0]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)  # every call ended: none left behind
        tally.calls += len(calls)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        results = [r for r in outcomes if not isinstance(r, BaseException)]
        tally.starved |= sum(map(len, results)) < sum(ways)
        grown = [(Partial([*p.steps, d.text], p.tokens + d.tokens, p.score, p.group), d)
                 for p, draws in zip([p for p, k in zip(beams, ways, strict=True) if k > 0], results, strict=True)
                 for d in draws]
        if not grown:
            return None
        verifier = run.parts.verifier
        if isinstance(verifier, LikelihoodVerifier):  # the step's own token log-probs, no model call
            for p, d in grown:
                p.score = p.whole = verifier.extend(p.score, d)
            return grown
        scores = await run.step_scores(q, [p.steps for p, _ in grown])
        tally.prm_calls += 1
        for (p, _), (steps, whole) in zip(grown, scores, strict=True):
            p.score, p.whole = (steps[-1] if steps else 0.0), whole
        return grown

    def keep(self, rng: random.Random, going: list[Partial], room: int, spec: SearchSpec) -> list[Partial]:
        """The unfinished partial solutions that grow on (``room``: solutions still to finish)."""
        raise NotImplementedError

    @staticmethod
    def solution(p: Partial, last: Draw, spec: SearchSpec) -> Draw:
        """A finished solution as a sample: its steps joined by the delimiter, every step's tokens."""
        return Draw(text=spec.step_delimiter.join(p.steps), finish_reason=last.finish_reason, tokens=p.tokens,
                    logprob=None, stop_reason=last.stop_reason)


class BeamSearch(StepSearch):
    method = "beam"

    def fanout(self, beams: Sequence[Partial], width: int, spec: SearchSpec, step: int) -> list[int]:
        return [width] if step == 0 else [spec.expand] * len(beams)

    def keep(self, rng: random.Random, going: list[Partial], room: int, spec: SearchSpec) -> list[Partial]:
        """The best ``width / expand`` by score, distinct partial solutions first: a step sampled the same
        way twice (common where the model is sure) would otherwise fill the beam with copies of one
        prefix and crowd out the runner-up; copies are kept only where there are too few distinct ones."""
        beams = max(1, min(room, spec.width) // spec.expand) if room > 0 else 0
        distinct: list[Partial] = []
        copies: list[Partial] = []
        seen: set[tuple[str, ...]] = set()
        for p in sorted(going, key=lambda p: -p.score):
            (copies if tuple(p.steps) in seen else distinct).append(p)
            seen.add(tuple(p.steps))
        return (distinct + copies)[:beams]


class DiverseBeams(StepSearch):
    method = "dvts"

    def start(self, width: int, spec: SearchSpec) -> list[Partial]:
        return [Partial(group=g) for g in range(max(1, width // spec.expand))]

    def fanout(self, beams: Sequence[Partial], width: int, spec: SearchSpec, step: int) -> list[int]:
        return [spec.expand] * len(beams)

    def keep(self, rng: random.Random, going: list[Partial], room: int, spec: SearchSpec) -> list[Partial]:
        best: dict[int, Partial] = {}
        for p in going:  # each subtree keeps its best continuation
            if p.group not in best or p.score > best[p.group].score:
                best[p.group] = p
        return sorted(best.values(), key=lambda p: -p.score)[:max(0, room)]


class ParticleFilter(StepSearch):
    method = "particles"

    def fanout(self, beams: Sequence[Partial], width: int, spec: SearchSpec, step: int) -> list[int]:
        return [width] if step == 0 else [1] * len(beams)

    def keep(self, rng: random.Random, going: list[Partial], room: int, spec: SearchSpec) -> list[Partial]:
        if not going or room <= 0:
            return []
        weights = [max(p.score, 1e-6) for p in going]
        picked = rng.choices(going, weights=weights, k=room)
        return [Partial(list(p.steps), p.tokens, p.score, p.group) for p in picked]


SEARCHES: Mapping[str, StepSearch] = MappingProxyType(
    {"beam": BeamSearch(), "dvts": DiverseBeams(), "particles": ParticleFilter()})
"""The step-level search strategies by ``search.method``; stateless, one instance serves every run."""
