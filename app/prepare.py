"""Preparation: what a run is, decided once, before its first sample, and then never changed.

Both adapters, :mod:`app.serving` (an OpenAI request: one query) and :mod:`app.batches` (a batch: one
query per prompt), build their :class:`RunSpec` through the one :class:`Preparer`, which owns every
step they share:

* the policy: the request's, else the key's default, else the service's (or the adapter's own
  fallback), resolved to an immutable snapshot (:meth:`Preparer.resolve`);
* its parts (:meth:`Preparer.build`), built once with the request's overrides (answer kind,
  schedule, per-sample token cost) and never mutated afterwards; a learning allocator brought up to
  the replicas' shared log;
* the checks: a network target named by a user key's inline policy (403), a verifier that needs a
  reference or tests the request lacks, the size of every prompt (:meth:`Preparer.check_prompt`) and
  per-sample ``max_tokens`` against ``limits``, the per-query cap (:meth:`Preparer.cap`: the server's
  limit, one sample for greedy decoding), the deadline.

Every check is a 4xx naming the field (``where`` + the field), raised before anything is sent.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from app.answers import AnswerSpec
from app.auth import Principal
from app.backends.pool import ModelCatalog
from app.config import LimitsConfig
from app.errors import InvalidRequest
from app.policy import (
    Overrides,
    PartsCache,
    PolicyParts,
    PolicyResolver,
    PolicySnapshot,
    Schedule,
    answer_error,
    check_targets,
    resolve,
)
from app.protocol import ChatMessage, PolicySpec, ScheduleSpec
from app.run import Query, Resume, RunLimits
from app.shared_stats import SharedLearning

Route = Literal["chat", "completion", "batch"]


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run, decided before its first sample and immutable afterwards: ``id`` is the request id,
    ``started`` the ``time.perf_counter()`` of its arrival (latency counts from there),
    ``budget_param`` the request field of the token budget (named when it buys no sample), ``resume``
    a checkpoint to continue from (a batch taken over from another replica)."""

    route: Route
    id: str
    model: str
    snapshot: PolicySnapshot
    parts: PolicyParts
    queries: Sequence[Query]
    limits: RunLimits
    seed: int | None
    principal: Principal | None
    started: float
    budget_param: str = "ttc.budget.max_tokens"
    resume: Resume | None = None


@dataclass(frozen=True, slots=True)
class Needs:
    """What a request offers the policy's verifier: a reference for every query, tests for every query;
    ``tests_where`` names the field a missing test set is reported under."""

    references: bool = False
    tests: bool = False
    reference_where: str = "ttc.reference"
    tests_where: str = "ttc.tests"
    tests_hint: str = " ({asserts} or {check, entry_point})"
    chat: bool = True
    """Every query is a chat request (a thought streams in a field of its own, which probes read)."""


class Preparer:
    """The steps every adapter shares (see the module doc). ``parts`` builds a run's parts from its
    snapshot; ``shared``: the replicas' learning log (Redis), when configured; ``rng`` draws the seeds
    of unseeded runs."""

    def __init__(self, policies: PolicyResolver, parts: PartsCache, limits: LimitsConfig, models: ModelCatalog,
                 *, default_max_tokens: int, shared: SharedLearning | None = None,
                 rng: random.Random | None = None, stream_policy: str | None = None,
                 effort_budgets: Mapping[str, int | None] | None = None) -> None:
        self.policies = policies
        self.parts = parts
        self.limits = limits
        self.models = models
        self.default_max_tokens = default_max_tokens
        self.shared = shared
        self.rng = rng or random.Random()
        self.stream_policy = stream_policy
        """The policy of streamed requests that name none (``None``: the service's default)."""
        self.effort_budgets: Mapping[str, int | None] = effort_budgets or {}
        """Thought tokens per sample for each ``reasoning_effort``."""

    def model(self, name: str | None) -> str:
        """The request's model (default: the service's); 404 naming ``model`` when nobody serves it."""
        return self.models.check(name)

    async def resolve(self, requested: str | PolicySpec | None, caller: Principal | None, *, where: str,
                      fallback: str | None = None) -> PolicySnapshot:
        """The run's policy as an immutable snapshot: ``requested``, else the key's default policy,
        else ``fallback``, else the service's default."""
        if requested is None and caller is not None and caller.default_policy:
            requested = caller.default_policy
        return await resolve(self.policies, requested if requested is not None else fallback, where,
                             limits=self.limits)

    async def build(self, snapshot: PolicySnapshot, caller: Principal | None, *, seed: int | None, where: str,
                    answer: AnswerSpec | None = None, answer_where: str = "ttc.answer",
                    schedule: ScheduleSpec | None = None, needs: Needs = Needs(),
                    tokens_per_sample: int | None = None) -> PolicyParts:
        """The run's parts, built once: ``answer``/``schedule`` override the policy's;
        ``tokens_per_sample`` caps the allocator's estimate of a sample's cost (a token budget). Checks
        a user key's network targets, what the verifier needs (``needs``) and that a search step's
        ``step_tokens`` is within the per-sample ``limits.max_tokens`` (every step is one call)."""
        if answer is not None:
            answer_error(answer, answer_where)
        over = Overrides(answer=answer, schedule=None if schedule is None else Schedule.of(schedule),
                         tokens_per_sample=tokens_per_sample)
        parts = await self.parts_for(snapshot, seed, over)
        check_targets(snapshot, parts, operator=caller is None or caller.role == "admin", where=where)
        if parts.probe is not None and (parts.schedule.mode != "stream" or not needs.chat):
            what = "the stream schedule" if needs.chat else "chat requests (/v1/chat/completions)"
            raise InvalidRequest(f"The policy probes running thoughts, which needs {what}.",
                                 param="ttc.schedule" if needs.chat and schedule is not None else where,
                                 code="unsupported_value")
        if parts.search is not None:
            self.check_max_tokens(parts.search.step_tokens, f"{where}.search.step_tokens")  # a step is one call
        verifier = parts.verifier
        if verifier is not None and verifier.needs_reference and not needs.references:
            raise InvalidRequest(f"Verifier {verifier.name!r} needs a reference answer in {needs.reference_where}.",
                                 param=needs.reference_where, code="reference_required")
        if verifier is not None and verifier.needs_tests and not needs.tests:
            raise InvalidRequest(f"Verifier {verifier.name!r} needs tests in {needs.tests_where}{needs.tests_hint}.",
                                 param=needs.tests_where, code="tests_required")
        return parts

    async def parts_for(self, snapshot: PolicySnapshot, seed: int | None, over: Overrides = Overrides()) -> PolicyParts:
        """A run's parts: a fresh allocator seeded by ``seed`` (or a random seed), or the policy's
        learning allocator brought up to the end of the shared log (:mod:`app.shared_stats`; a Redis
        failure only means planning with what it has)."""
        parts = self.parts.build(snapshot, random.Random(seed if seed is not None else self.rng.getrandbits(63)),
                                 over)
        if parts.learns and self.shared is not None:
            try:
                await self.shared.pull(snapshot, parts.allocator)
            except Exception as exc:
                import logging

                logging.getLogger("ttc.request").warning("could not pull shared statistics: %s", exc)
        return parts

    def check_max_tokens(self, value: int | None, param: str) -> None:
        """Per-sample ``max_tokens`` within ``limits.max_tokens``."""
        if value is not None and value > self.limits.max_tokens:
            raise InvalidRequest(f"{param}={value} is above this server's limit of {self.limits.max_tokens} "
                                 "per sample.", param=param, code="too_large")

    def check_prompt(self, prompt: str | Sequence[ChatMessage] | Sequence[Any], where: str) -> None:
        """One prompt (text, or chat messages) within ``limits.max_messages`` and
        ``limits.max_prompt_chars`` (all messages' text together)."""
        lim = self.limits
        if isinstance(prompt, str):
            chars, what = len(prompt), ""
        else:
            if len(prompt) > lim.max_messages:
                raise InvalidRequest(f"{len(prompt)} messages is above this server's limit of {lim.max_messages}.",
                                     param=where, code="too_large")
            chars, what = sum(_content_chars(m) for m in prompt), f"{len(prompt)} messages, "
        if chars > lim.max_prompt_chars:
            raise InvalidRequest(f"The prompt ({what}{chars} characters) is above this server's limit of "
                                 f"{lim.max_prompt_chars} characters.", param=where, code="too_large")

    def cap(self, requested: int | None, temperature: float | None) -> int:
        """The per-query cap: ``requested`` within the server's ``limits.max_samples``, and one sample
        for greedy decoding (``temperature: 0``: every further sample would be the same text, and vLLM
        refuses ``n > 1`` with greedy sampling)."""
        if temperature == 0:
            return 1
        limit = self.limits.max_samples
        return limit if requested is None else min(requested, limit)

    def check_samples(self, max_samples: int | None, param: str) -> None:
        limit = self.limits.max_samples
        if max_samples is not None and max_samples > limit:
            raise InvalidRequest(f"{param}={max_samples} is above this server's limit of {limit}.", param=param,
                                 code="budget_too_large")

    @staticmethod
    def deadline(ms: int | None, since: float | None = None) -> float | None:
        """The absolute ``loop.time()`` of a deadline ``ms`` after the request arrived (``since``, a
        ``time.time()``; default now)."""
        if ms is None:
            return None
        late = 0.0 if since is None else time.time() - since
        return asyncio.get_running_loop().time() + ms / 1000 - late


def _content_chars(message: ChatMessage | dict[str, Any] | Any) -> int:
    """A message's text length (a list of parts: the length of its text form; not a message: 0)."""
    if isinstance(message, ChatMessage):
        content = message.content
    elif isinstance(message, dict):
        content = message.get("content")
    else:
        return 0
    return len(content) if isinstance(content, str) else len(str(content or ""))
