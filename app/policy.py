"""Policies: validation against the registries, immutable snapshots, and name resolution.

A request resolves its policy once, at arrival, to a :class:`PolicySnapshot` (frozen spec + name +
version). Everything the engine builds for that request comes from the snapshot, so editing a
policy never affects requests already in flight.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from allocators import Allocator
from allocators.registry import UnknownAllocatorError
from allocators.registry import available as available_allocators
from allocators.registry import create as create_allocator
from app.aggregators import Aggregator, UnknownAggregatorError, builtin_aggregators, create_aggregator
from app.answers.kinds import AnswerSpec
from app.errors import InvalidRequest, NotFound, validation_to_error
from app.verifiers import UnknownVerifierError, Verifier, builtin_verifiers, create_verifier
from app.wire import PolicySpec

BUILTIN_POLICIES: Mapping[str, Mapping[str, Any]] = {
    "adaptive": {"allocator": "adaptive_consistency", "aggregator": "majority"},
    "esc": {"allocator": "esc", "aggregator": "majority"},
    "confident": {"allocator": "margin", "aggregator": "weighted_majority", "verifier": {"name": "likelihood"}},
    "self-consistency-8": {"allocator": "fixed", "params": {"n": 8}, "aggregator": "majority"},
    "single": {"allocator": "fixed", "params": {"n": 1}, "aggregator": "majority"},
    "elimination": {"allocator": "elimination", "aggregator": "majority"},
    "greedy": {"allocator": "greedy", "aggregator": "majority"},
    "uniform": {"allocator": "uniform", "aggregator": "majority"},
}


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """A policy as resolved for one request: never mutated afterwards."""

    name: str
    version: int
    spec: PolicySpec

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, **self.spec.model_dump(exclude_none=True)}


@dataclass(slots=True)
class PolicyParts:
    """The built pieces of one run: ``answer`` is the answer kind spec (``None``: ``auto``)."""

    allocator: Allocator
    aggregator: Aggregator
    verifier: Verifier | None
    answer: AnswerSpec | None = None


def parse_spec(data: Any, where: str = "ttc.policy") -> PolicySpec:
    """Parse and fully validate a policy spec; a 400 naming ``where.<field>`` when it is wrong."""
    try:
        spec = data if isinstance(data, PolicySpec) else PolicySpec.model_validate(data)
    except ValidationError as exc:
        raise validation_to_error(exc, prefix=where) from None
    validate_spec(spec, where)
    return spec


def validate_spec(spec: PolicySpec, where: str = "ttc.policy") -> None:
    """Check names exist, params validate against each registry's schema, and the combo makes sense."""
    try:
        build_parts(spec, random.Random(0))
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


class _PartValidation(Exception):
    def __init__(self, part: str, error: ValidationError) -> None:
        self.part, self.error = part, error


def build_parts(spec: PolicySpec, rng: random.Random) -> PolicyParts:
    """Instantiate the allocator, aggregator and verifier of a spec (raises on unknown names)."""
    try:
        allocator = create_allocator(spec.allocator, spec.params, rng)
    except ValidationError as exc:
        raise _PartValidation("params", exc) from None
    aggregator = create_aggregator(spec.aggregator)
    verifier = None
    if spec.verifier is not None:
        try:
            verifier = create_verifier(spec.verifier.name, spec.verifier.params)
        except ValidationError as exc:
            raise _PartValidation("verifier.params", exc) from None
    if spec.answer is not None:
        check_answer(spec.answer, "answer.params")
    return PolicyParts(allocator, aggregator, verifier, spec.answer)


def check_answer(answer: AnswerSpec, part: str) -> None:
    """Validate an answer spec's params for its kind (raises :class:`_PartValidation` naming ``part``)."""
    try:
        answer.validated_params()
    except ValidationError as exc:
        raise _PartValidation(part, exc) from None


def answer_error(answer: AnswerSpec, where: str) -> None:
    """A 400 naming ``where.params.<field>`` when an answer spec's params are wrong for its kind."""
    try:
        check_answer(answer, "params")
    except _PartValidation as exc:
        raise validation_to_error(exc.error, prefix=f"{where}.{exc.part}") from None


class PolicyResolver(Protocol):
    """Where named policies come from (the policy store: built-ins, config-declared and API-managed)."""

    async def get(self, name: str, version: int | None = None) -> PolicySnapshot: ...

    async def default_name(self) -> str: ...


async def resolve(resolver: PolicyResolver, requested: str | PolicySpec | None,
                  where: str = "ttc.policy") -> PolicySnapshot:
    """Resolve a request's policy (name, inline spec or nothing) to a snapshot; errors name ``where``."""
    if requested is None:
        return await resolver.get(await resolver.default_name())
    if isinstance(requested, str):
        try:
            return await resolver.get(requested)
        except NotFound as exc:
            exc.param = where
            raise
    return PolicySnapshot("inline", 0, parse_spec(requested, where))
