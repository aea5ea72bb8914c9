"""Compute-optimal test-time compute: the strategy of a query chosen by its estimated difficulty.

The rule (Snell et al.'s view that the best use of compute depends on how hard a query is), per query:

1. **probe**: ``optimal.probe`` whole samples in one call, scored by the policy's verifier (the ``prm``
   verifier's aggregate of their steps, or the ``likelihood`` verifier's reading of their tokens'
   log-probs: no PRM at all); they stay among the query's answers;
2. **difficulty**: their *agreement*, the leading answer's share of the votes (0 when none answered);
   the bin is how many of the descending ``optimal.bins`` thresholds it falls below (bin 0: the
   samples agree, an easy query; the last bin: they scatter, a hard one);
3. **choice**: the bin's ``optimal.table`` entry: ``majority`` draws whole samples up to ``width`` in
   all (one more call, scored the same way); ``beam``, ``dvts`` or ``particles`` runs that step-level
   search of ``width`` (:mod:`app.search`, with the policy's ``search`` step settings), its finished
   solutions joining the probe's samples.

The policy's aggregator then selects among every sample (a ``weighted_majority`` by the verifier suits
both kinds). The ``ttc`` block's ``search.optimal`` shows the rule's reading: agreement, bin and choice
("bin 2 -> beam, width 8"). ``ttc optimal fit`` fits the table from runs on a problem set.
"""

from __future__ import annotations

from app.protocol import OptimalChoice, OptimalSpec, SearchSpec
from app.query import QueryRun
from app.run import Run
from app.search import SEARCHES, each_query

DEFAULT_STEPS = SearchSpec(method="beam")
"""Step settings when the policy gives no ``search`` spec."""


def difficulty_bin(agreement: float, bins: list[float]) -> int:
    """How many of the descending thresholds ``agreement`` falls below."""
    return sum(agreement < b for b in bins)


def agreement(run: QueryRun) -> float:
    """The leading answer's share of the votes (0 without one)."""
    votes = run.state.votes()
    total = sum(votes.values())
    return max(votes.values()) / total if total else 0.0


class ComputeOptimal:
    """The compute-optimal strategy (see the module doc); stateless."""

    async def run(self, run: Run) -> str:
        spec = run.parts.optimal
        assert spec is not None
        return await each_query(run, lambda q: self.query(run, q, spec))

    async def query(self, run: Run, q: QueryRun, spec: OptimalSpec) -> str:
        probe = min(spec.probe, q.query.cap)
        if not await self.sample(run, q, probe, "probe"):
            return "tokens"
        share = agreement(q)
        b = difficulty_bin(share, list(spec.bins))
        choice = spec.table[b]
        q.search = {"optimal": {"agreement": round(share, 4), "bin": b, "choice": describe(choice)}}
        run.rounds = max(run.rounds, 1)
        await run.notify()
        if choice.method == "majority":
            more = min(choice.width, q.query.cap) - q.state.spent
            return "policy" if more <= 0 or await self.sample(run, q, more, "more") else "tokens"
        steps = run.parts.search or DEFAULT_STEPS
        how = steps.model_copy(update={"method": choice.method, "width": choice.width})
        reason = await SEARCHES[choice.method].query(run, q, how)
        q.search = {**(q.search or {}), "optimal": {"agreement": round(share, 4), "bin": b,
                                                    "choice": describe(choice)}}
        return reason

    @staticmethod
    async def sample(run: Run, q: QueryRun, n: int, salt: str) -> bool:
        """``n`` whole samples in one call, scored by the verifier, joined to the query; whether any came."""
        req = run.request_for(q)  # with log-probs when the verifier reads them
        limit = int(req.params.get("max_tokens") or run.engine.default_max_tokens)
        draws = await run.generate(q, req, n, limit, run.call_seed(q, salt))
        if not draws:
            return False
        await run.finish_samples(q, req, draws)
        return True


def describe(choice: OptimalChoice) -> str:
    return f"{choice.method}, width {choice.width}"


OPTIMAL = ComputeOptimal()
