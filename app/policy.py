"""Policies: validation against the registries, immutable snapshots, and name resolution.

A request resolves its policy once, at arrival, to a :class:`PolicySnapshot` (frozen spec + name +
version). Everything the engine builds for that request comes from the snapshot, so editing a
policy never affects requests already in flight.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from cachetools import LRUCache
from pydantic import ValidationError

from allocators import Allocator, AllocatorParams, UnknownAllocatorError
from allocators import available as available_allocators
from allocators import resolve as resolve_allocator
from app.aggregators import Aggregator, UnknownAggregatorError, builtin_aggregators, create_aggregator
from app.answers.spec import AnswerSpec, KindFactory, kind_factory
from app.errors import Forbidden, InvalidRequest, NotFound, validation_to_error
from app.protocol import OptimalSpec, PolicySpec, ProbeSpec, ScheduleSpec, SearchSpec
from app.verifiers import ParamLimits, UnknownVerifierError, Verifier, builtin_verifiers, create_verifier

_STREAM = {"mode": "stream"}
"""The adaptive built-ins stream: in the load test of the README their p50 fell 16-30% against rounds,
at the same tokens and accuracy (fixed-size and batch policies keep rounds: nothing to decide early)."""

_DEMO_PRM = {"name": "prm", "params": {"url": "embedded:arith-prm", "model": "arith-prm", "step_delimiter": "\n",
                                      "format": "input"}}
"""The bundled process reward model as the search built-ins' verifier (one step a line)."""
_DEMO_STEPS = {"step_delimiter": "\n", "step_tokens": 48, "max_steps": 12}
"""A demo solution's steps: lines of at most 48 tokens, at most 12 of them."""

BUILTIN_POLICIES: Mapping[str, Mapping[str, Any]] = {
    # what a request without a ttc block gets: at most 4 samples (2.7 on average on the demo model), and
    # one when the first sample carries no answer (a prompt that is not a question, a sample cut short)
    "default": {"allocator": "margin", "params": {"max_samples": 4, "give_up_after": 1},
                "aggregator": "weighted_majority",
                "verifier": {"name": "likelihood", "params": {"missing": "unweighted"}}, "schedule": _STREAM},
    # the adaptive built-ins draw at most self-consistency-8's 8 samples: they stop early where samples agree
    # and never spend more than the fixed baseline (the papers' caps, 40 / 40 / 32, are a `params` away)
    "adaptive": {"allocator": "adaptive_consistency", "params": {"max_samples": 8}, "aggregator": "majority",
                 "schedule": _STREAM},
    # reasoning models: adaptive stopping, each running thought probed for its answer (app.probes)
    "adaptive-probe": {"allocator": "adaptive_consistency", "aggregator": "majority", "schedule": _STREAM,
                       "probe": {}},
    "esc": {"allocator": "esc", "params": {"window": 4, "max_samples": 8}, "aggregator": "majority",
            "schedule": _STREAM},
    "confident": {"allocator": "margin", "params": {"max_samples": 8}, "aggregator": "weighted_majority",
                  "verifier": {"name": "likelihood"}, "schedule": _STREAM},
    # confident with its margin learned from traffic (a quantile of the first sample's likelihood), so it
    # means the same for 64-token answers and 1,000-token thoughts (allocators.calibrated)
    "calibrated": {"allocator": "calibrated_margin", "aggregator": "weighted_majority",
                   "verifier": {"name": "likelihood", "params": {"temperature": 3.0}}, "schedule": _STREAM},
    "self-consistency-8": {"allocator": "fixed", "params": {"n": 8}, "aggregator": "majority"},
    # DeepConf online: traces are cut mid-way, so they stream
    "deepconf": {"allocator": "deepconf", "params": {"warmup": 3, "max_samples": 8}, "aggregator": "majority",
                 "schedule": _STREAM},
    "single": {"allocator": "fixed", "params": {"n": 1}, "aggregator": "majority"},
    # step-level search on the demo model with the bundled PRM (embedded:arith-prm), one line a step: 8
    # beams (or particles) finish and the PRM's best answers: the rows beam-8, dvts-8, particles-8 of `ttc
    # optimal compare` (README, "Step-level search")
    "beam": {"allocator": "fixed", "aggregator": "best_of_n", "verifier": _DEMO_PRM,
             "search": {**_DEMO_STEPS, "method": "beam", "width": 8}},
    "dvts": {"allocator": "fixed", "aggregator": "best_of_n", "verifier": _DEMO_PRM,
             "search": {**_DEMO_STEPS, "method": "dvts", "width": 8}},
    "particles": {"allocator": "fixed", "aggregator": "best_of_n", "verifier": _DEMO_PRM,
                  "search": {**_DEMO_STEPS, "method": "particles", "width": 8}},
    # the same beam search scored by the generator's own token log-probs (a partial solution's least likely
    # token), no PRM: any model that reports log-probs; on the demo's hardest levels it matched a majority
    # of 16 with half its tokens (README, "Step-level search")
    "beam-likelihood": {"allocator": "fixed", "aggregator": "best_of_n",
                        "verifier": {"name": "likelihood", "params": {"aggregate": "min"}},
                        "search": {**_DEMO_STEPS, "method": "beam", "width": 8}},
    # 4 probe samples estimate difficulty by their agreement; the table was fitted by `ttc optimal fit` on
    # the demo problems
    "compute-optimal": {
        "allocator": "fixed", "aggregator": "weighted_majority", "verifier": _DEMO_PRM,
        "search": {**_DEMO_STEPS, "method": "beam"},
        "optimal": {"probe": 4, "bins": [0.99, 0.7, 0.45],
                    "table": [{"method": "majority", "width": 4}, {"method": "majority", "width": 8},
                              {"method": "particles", "width": 8}, {"method": "majority", "width": 16}]}},
    # compute-optimal scored by the generator's own likelihood, no PRM: 2 probe samples; where they agree they
    # are the answer, else a beam of 2 by the least likely token. Fitted by `ttc optimal fit --levels 3,4,5
    # --candidates majority:2,majority:4,beam:2,beam:4 --bins 0.99 --probe 2`; on levels 4-5 it was more
    # accurate than best-of-16 by the PRM with a third of its generated tokens (README, "Step-level search")
    "compute-optimal-likelihood": {
        "allocator": "fixed", "aggregator": "weighted_majority",
        "verifier": {"name": "likelihood", "params": {"aggregate": "min"}},
        "search": {**_DEMO_STEPS, "method": "beam"},
        "optimal": {"probe": 2, "bins": [0.99],
                    "table": [{"method": "majority", "width": 2}, {"method": "beam", "width": 2}]}},
    "elimination": {"allocator": "elimination", "aggregator": "majority"},
    "greedy": {"allocator": "greedy", "aggregator": "majority"},
    "uniform": {"allocator": "uniform", "aggregator": "majority"},
}


@dataclass(frozen=True)
class PolicySnapshot:
    """A policy as resolved for one request: never mutated afterwards."""

    name: str
    version: int
    spec: PolicySpec

    @property
    def inline(self) -> bool:
        """A spec the client sent with its request (not a stored policy)."""
        return self.version == 0

    def describe(self) -> dict[str, Any]:
        """Name, version and the spec as JSON (a fresh dict; the spec is dumped once per snapshot)."""
        return {"name": self.name, "version": self.version, **self._spec_json}

    @property
    def _spec_json(self) -> dict[str, Any]:
        cached: dict[str, Any] | None = getattr(self, "_dumped", None)
        if cached is None:
            cached = self.spec.model_dump(exclude_none=True)
            object.__setattr__(self, "_dumped", cached)
        return cached


@dataclass(frozen=True, slots=True)
class Schedule:
    """How samples are launched (see the module doc): ``rounds`` (one ``n=k`` call per query per
    round, a barrier between rounds) or ``stream`` (one streamed call per sample, at most ``width``
    in flight per query, the allocator asked at every completion)."""

    mode: Literal["rounds", "stream"] = "rounds"
    width: int = 8
    speculate: bool = True
    """stream: start more than the allocator asks for while the backends are idle (see app.sampling)."""

    @classmethod
    def of(cls, spec: ScheduleSpec | None) -> Schedule:
        return cls() if spec is None else cls(spec.mode, spec.width, spec.speculate)


@dataclass(frozen=True, slots=True)
class PolicyParts:
    """The built pieces of one run, never changed once built (the allocator object keeps the run's
    own state): ``answer`` is the answer kind spec (``None``: ``auto``) and ``kind`` builds it for a
    query; ``learns`` says the allocator is its policy's long-lived learning one (fed finished queries)."""

    allocator: Allocator
    aggregator: Aggregator
    verifier: Verifier | None
    answer: AnswerSpec | None = None
    learns: bool = False
    schedule: Schedule = Schedule()
    search: SearchSpec | None = None
    """Step-level search instead of whole samples (the strategy of :mod:`app.search`)."""
    optimal: OptimalSpec | None = None
    """Compute-optimal: the strategy chosen per query (:mod:`app.optimal`)."""
    probe: ProbeSpec | None = None
    """Probes of running thoughts (:mod:`app.probes`; streamed chat traces)."""
    kind: KindFactory = field(default_factory=lambda: kind_factory(None))

    def with_answer(self, answer: AnswerSpec) -> PolicyParts:
        """These parts with another answer kind (a valid spec: raises ``pydantic.ValidationError``)."""
        return replace(self, answer=answer, kind=kind_factory(answer))

    def cap(self, query_cap: int) -> int:
        """The most samples a query can get: its cap, tightened by the allocator's own (so "samples
        saved" compares with what the policy could spend)."""
        own = self.allocator.own_cap
        return query_cap if own is None else min(query_cap, own)


@dataclass(frozen=True, slots=True)
class Overrides:
    """What a request sets over its policy's parts: the answer kind, the schedule, and the most tokens
    one sample may cost (under a token budget the allocator's ``tokens_per_sample`` estimate is at
    most the request's per-sample ``max_tokens``, so a budget of a few short samples buys them)."""

    answer: AnswerSpec | None = None
    schedule: Schedule | None = None
    tokens_per_sample: int | None = None


@dataclass(frozen=True, slots=True)
class PartsFactory:
    """The validated pieces of one policy spec, built once: :meth:`build` gives a run its parts (a
    fresh allocator seeded by the run's RNG; the aggregator and verifier hold no per-request state and
    are shared)."""

    allocator_cls: type[Allocator]
    params: AllocatorParams
    aggregator: Aggregator
    verifier: Verifier | None
    answer: AnswerSpec | None
    kind: KindFactory
    schedule: Schedule
    search: SearchSpec | None = None
    optimal: OptimalSpec | None = None
    probe: ProbeSpec | None = None

    @classmethod
    def from_spec(cls, spec: PolicySpec, limits: ParamLimits | None = None) -> PartsFactory:
        """Validate and build (raises on unknown names; ``_PartValidation`` on bad params). ``limits``: the
        service's limits the verifier's params are held to (a client's inline spec), on top of their static
        bounds."""
        allocator_cls = resolve_allocator(spec.allocator)
        try:
            params = allocator_cls.Params.model_validate(dict(spec.params))
        except ValidationError as exc:
            raise _PartValidation("params", exc) from None
        aggregator = create_aggregator(spec.aggregator)
        verifier = None
        if spec.verifier is not None:
            try:
                verifier = create_verifier(spec.verifier.name, spec.verifier.params, limits)
            except ValidationError as exc:
                raise _PartValidation("verifier.params", exc) from None
        kind = check_answer(spec.answer, "answer.params")
        return cls(allocator_cls, params, aggregator, verifier, spec.answer, kind, Schedule.of(spec.schedule),
                   spec.search, spec.optimal, spec.probe)

    def build(self, rng: random.Random, over: Overrides = Overrides(), shared: Allocator | None = None) -> PolicyParts:
        """A run's parts: a fresh allocator seeded by ``rng`` with the request's overrides, or the
        policy's ``shared`` learning allocator (whose params no request changes)."""
        allocator = shared
        if allocator is None:
            params = self.params
            per_sample = over.tokens_per_sample
            if per_sample is not None and per_sample < getattr(params, "tokens_per_sample", per_sample):
                params = params.model_copy(update={"tokens_per_sample": per_sample})
            allocator = self.allocator_cls(params, rng)
        kind = self.kind if over.answer is None else kind_factory(over.answer)  # the Preparer validated it
        return PolicyParts(allocator, self.aggregator, self.verifier, over.answer or self.answer,
                           learns=shared is not None, schedule=over.schedule or self.schedule, search=self.search,
                           optimal=self.optimal, probe=self.probe, kind=kind)


class PartsCache:
    """Built parts of stored policy versions, bounded (LRU of ``maxsize`` versions). Inline specs come
    from clients, so they are built per request and never kept; a learning (``shared``) allocator
    exists only for a stored version, one per version (``seed`` seeds it)."""

    def __init__(self, maxsize: int = 256, seed: int = 0) -> None:
        self.seed = seed
        self._factories: LRUCache[tuple[str, int], PartsFactory] = LRUCache(maxsize)
        self._shared: LRUCache[tuple[str, int], Allocator] = LRUCache(maxsize)

    def __len__(self) -> int:
        return len(self._factories) + len(self._shared)

    def build(self, snapshot: PolicySnapshot, rng: random.Random, over: Overrides = Overrides()) -> PolicyParts:
        if snapshot.inline:
            return PartsFactory.from_spec(snapshot.spec).build(rng, over)
        key = (snapshot.name, snapshot.version)
        factory = self._factories.get(key)
        if factory is None:
            factory = self._factories[key] = PartsFactory.from_spec(snapshot.spec)
        shared = None
        if factory.allocator_cls.shared:
            shared = self._shared.get(key)
            if shared is None:
                shared = self._shared[key] = factory.build(random.Random(self.seed)).allocator
        return factory.build(rng, over, shared)


def parse_spec(data: Any, where: str = "ttc.policy", limits: ParamLimits | None = None) -> PolicySpec:
    """Parse and fully validate a policy spec; a 400 naming ``where.<field>`` when it is wrong. With
    ``limits`` (the service's :class:`~app.config.LimitsConfig`) a verifier's params are held to them too."""
    try:
        spec = data if isinstance(data, PolicySpec) else PolicySpec.model_validate(data)
    except ValidationError as exc:
        raise validation_to_error(exc, prefix=where) from None
    validate_spec(spec, where, limits)
    return spec


def validate_spec(spec: PolicySpec, where: str = "ttc.policy", limits: ParamLimits | None = None) -> None:
    """Check names exist, params validate against each registry's schema (and ``limits``), and the combo
    makes sense."""
    try:
        PartsFactory.from_spec(spec, limits).build(random.Random(0))
    except UnknownAllocatorError:
        names = ", ".join(sorted(available_allocators()))
        raise InvalidRequest(
            f"Unknown allocator {spec.allocator!r}; available: {names}.", param=f"{where}.allocator",
            code="unknown_allocator",
        ) from None
    except UnknownAggregatorError:
        names = ", ".join(sorted(builtin_aggregators()))
        raise InvalidRequest(
            f"Unknown aggregator {spec.aggregator!r}; available: {names}.", param=f"{where}.aggregator",
            code="unknown_aggregator",
        ) from None
    except UnknownVerifierError:
        names = ", ".join(sorted(builtin_verifiers()))
        name = spec.verifier.name if spec.verifier else ""
        raise InvalidRequest(
            f"Unknown verifier {name!r}; available: {names}.", param=f"{where}.verifier.name",
            code="unknown_verifier",
        ) from None
    except _PartValidation as exc:
        raise validation_to_error(exc.error, prefix=f"{where}.{exc.part}") from None
    aggregator = create_aggregator(spec.aggregator)
    if aggregator.needs_verifier and spec.verifier is None:
        raise InvalidRequest(
            f"Aggregator {spec.aggregator!r} ranks by verifier score, so the policy needs a verifier.",
            param=f"{where}.verifier", code="verifier_required",
        )
    if spec.probe is not None and (spec.schedule is None or spec.schedule.mode != "stream"):
        raise InvalidRequest("Probes read each trace's thought as it streams: a policy with probes needs the stream "
                             "schedule.", param=f"{where}.schedule", code="unsupported_value")
    verifier = spec.verifier.name if spec.verifier is not None else None
    if (spec.search is not None or spec.optimal is not None) and verifier not in ("prm", "likelihood"):
        what = "The compute-optimal policy scores its probe samples and searches" if spec.optimal is not None \
            else "Step-level search scores partial solutions"
        raise InvalidRequest(f"{what} step by step: the policy needs the prm verifier (a process reward model) or "
                             "the likelihood verifier (the generator's token log-probs).", param=f"{where}.verifier",
                             code="verifier_required")


class _PartValidation(Exception):
    def __init__(self, part: str, error: ValidationError) -> None:
        self.part, self.error = part, error


def build_parts(spec: PolicySpec, rng: random.Random) -> PolicyParts:
    """Instantiate the allocator, aggregator and verifier of a spec (raises on unknown names)."""
    return PartsFactory.from_spec(spec).build(rng)


def check_answer(answer: AnswerSpec | None, part: str) -> KindFactory:
    """What builds an answer spec's kind, its params validated for the kind (raises
    :class:`_PartValidation` naming ``part``)."""
    try:
        return kind_factory(answer)
    except ValidationError as exc:
        raise _PartValidation(part, exc) from None


def answer_error(answer: AnswerSpec, where: str) -> None:
    """A 400 naming ``where.params.<field>`` when an answer spec's params are wrong for its kind."""
    try:
        check_answer(answer, "params")
    except _PartValidation as exc:
        raise validation_to_error(exc.error, prefix=f"{where}.{exc.part}") from None


def check_targets(snapshot: PolicySnapshot, parts: PolicyParts, *, operator: bool, where: str = "ttc.policy") -> None:
    """An inline spec may name a network target (a reward model's ``url``) only when the caller is the
    operator (an admin key, or auth off): a user key must not make the service call an address of
    its choosing. Raises a 403 naming the param."""
    verifier = parts.verifier
    if operator or not snapshot.inline or verifier is None or snapshot.spec.verifier is None:
        return
    named = sorted(verifier.network_params & snapshot.spec.verifier.params.keys())
    if named:
        raise Forbidden(
            f"An inline policy from a user key may not name a network target ({verifier.name} {named[0]}): use a "
            "policy an admin created.", param=f"{where}.verifier.params.{named[0]}", code="network_target_forbidden")


class PolicyResolver(Protocol):
    """Where named policies come from (the policy store: built-ins, config-declared and API-managed)."""

    async def get(self, name: str, version: int | None = None) -> PolicySnapshot: ...

    async def default_name(self) -> str: ...


async def resolve(resolver: PolicyResolver, requested: str | PolicySpec | None,
                  where: str = "ttc.policy", limits: ParamLimits | None = None) -> PolicySnapshot:
    """Resolve a request's policy (name, inline spec or nothing) to a snapshot; errors name ``where``. An
    inline spec (a client's) is held to ``limits``, the service's, like the request's own fields."""
    if requested is None:
        return await resolver.get(await resolver.default_name())
    if isinstance(requested, str):
        try:
            return await resolver.get(requested)
        except NotFound as exc:
            exc.param = where
            raise
    return PolicySnapshot("inline", 0, parse_spec(requested, where, limits))
