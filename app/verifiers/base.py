"""The verifier contract.

A verifier scores the candidates of one query: ``await verifier.score(ctx, draws)`` returns one
score in [0, 1] per draw (same order) and the tokens it spent, which count against the budget.
Verifiers are built once per policy from validated, frozen ``Params`` and hold no per-request
state; everything request-scoped (the request, a reference answer, the generator, the shared HTTP
client) comes in :class:`VerifyContext`. Failures raise :class:`VerifierError`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, ValidationInfo

from app.backends.base import Draw, SampleSource, SamplingRequest, Usage

if TYPE_CHECKING:
    from app.answers.canon import QueryCanon
    from app.code.harness import CodeTests
    from app.code.runner import CodeRunner


class VerifierError(Exception):
    """A verifier could not score the candidates (server down, bad response, missing input)."""


class UnknownVerifierError(KeyError):
    """No verifier is registered under that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown verifier"


@dataclass(slots=True)
class VerifyContext:
    """Request-scoped inputs: ``reference`` (gold answer, for the reference verifier),
    ``generator`` (for LLM judges), ``http`` (the app's shared client, for remote models),
    ``tests`` (the request's unit tests) and ``code`` (the app's sandboxed code runner), for the
    code_tests verifier; ``canon``, the query's answer canoniser (its answer kind, math-verify in
    worker processes), for comparing answers; ``owner``, the API key the request runs for (its
    programs take that key's turns in the sandbox; ``None``: no key, the operator's)."""

    request: SamplingRequest
    reference: str | None = None
    generator: SampleSource | None = None
    http: httpx.AsyncClient | None = None
    tests: CodeTests | None = None
    code: CodeRunner | None = None
    canon: QueryCanon | None = None
    owner: str | None = None
    endpoints: Mapping[str, str] = field(default_factory=dict)
    """Named URLs a verifier's ``url`` may refer to as ``embedded:NAME`` (the embedded PRM, ...)."""

    def resolve(self, url: str) -> str:
        """``url``, or for ``embedded:NAME`` the URL of that named endpoint (:class:`VerifierError` when
        there is none)."""
        if not url.startswith("embedded:"):
            return url
        name = url.removeprefix("embedded:")
        if name not in self.endpoints:
            raise VerifierError(f"no endpoint named {name!r} (the embedded engine did not start, or endpoints "
                                "does not name it)")
        return self.endpoints[name]


@dataclass(slots=True)
class VerifyResult:
    """``scores[i]`` in [0, 1] for candidate ``i``; ``usage`` is what the verifier spent."""

    scores: list[float]
    usage: Usage = field(default_factory=Usage)


class VerifierParams(BaseModel):
    """Base of every verifier's ``Params``: unknown fields are rejected, instances are frozen. Every field has
    static bounds; the service's own limits (:class:`ParamLimits`) apply on top when the params are validated
    with them as context (``Params.model_validate(data, context={"limits": limits})``, see
    :func:`app.verifiers.create_verifier`): a client's params are bounded like its request's fields."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class ParamLimits(Protocol):
    """The limits of :class:`app.config.LimitsConfig` a verifier's params are held to."""

    @property
    def max_tokens(self) -> int: ...

    @property
    def max_prompt_chars(self) -> int: ...


def context_limits(info: ValidationInfo) -> ParamLimits | None:
    """The limits the params are validated against (``None``: the static bounds only)."""
    context: Any = info.context
    return context.get("limits") if isinstance(context, dict) else None


def within_max_tokens(value: int, info: ValidationInfo) -> int:
    """A field validator: completion tokens a verifier asks per call, within ``limits.max_tokens``."""
    limits = context_limits(info)
    if limits is not None and value > limits.max_tokens:
        raise ValueError(f"{value} is above this server's limit of {limits.max_tokens} tokens per sample")
    return value


def within_prompt_chars(value: str, info: ValidationInfo) -> str:
    """A field validator: text a verifier sends with every call (a rubric, a template), within
    ``limits.max_prompt_chars``."""
    limits = context_limits(info)
    if limits is not None and len(value) > limits.max_prompt_chars:
        raise ValueError(f"{len(value)} characters is above this server's limit of {limits.max_prompt_chars} "
                         "prompt characters")
    return value


class Verifier(ABC):
    """Scores candidates. Subclasses set ``name``, ``Params`` and implement :meth:`score`."""

    name: ClassVar[str]
    Params: ClassVar[type[VerifierParams]] = VerifierParams
    needs_reference: ClassVar[bool] = False
    needs_logprobs: ClassVar[bool] = False
    needs_tests: ClassVar[bool] = False
    network_params: ClassVar[frozenset[str]] = frozenset()
    """Params that name a network target: only the operator (config, admin keys) may set them."""

    def __init__(self, params: VerifierParams | None = None) -> None:
        self.params = params if params is not None else self.Params()

    @property
    def reserve_tokens(self) -> int:
        """Most completion tokens one candidate's verification can spend (the engine reserves them
        within a token budget so verification never overspends it)."""
        return 0

    @abstractmethod
    async def score(self, ctx: VerifyContext, candidates: Sequence[Draw]) -> VerifyResult:
        """One score in [0, 1] per candidate, in order. Raises :class:`VerifierError`."""


def clamp01(x: float) -> float:
    """``x`` clipped to [0, 1]; NaN -> 0."""
    if math.isnan(x):
        return 0.0
    return min(1.0, max(0.0, x))


def squash(x: float) -> float:
    """``x`` if already in [0, 1], else the logistic ``1 / (1 + exp(-x))`` (a raw logit)."""
    if 0.0 <= x <= 1.0:
        return x
    if math.isnan(x):
        return 0.0
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)
