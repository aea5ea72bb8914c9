"""Verifiers: score the candidates of one query (see :mod:`app.verifiers.base` for the contract).

Built-ins: ``reference`` (gold answer), ``reward_model`` (vLLM classify/score/pooling endpoint),
``llm_judge`` (the generator grades each candidate), ``likelihood`` (the generator's own probability of
each completion, from its token log-probs), ``code_tests`` (the request's unit tests, run in the sandbox),
``prm`` (a process reward model: a score per step, vLLM's pooling runner).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.verifiers.base import (
    ParamLimits,
    UnknownVerifierError,
    Verifier,
    VerifierError,
    VerifierParams,
    VerifyContext,
    VerifyResult,
)
from app.verifiers.code_tests import CodeTestsVerifier
from app.verifiers.likelihood import LikelihoodVerifier
from app.verifiers.llm_judge import LLMJudgeVerifier
from app.verifiers.prm import PRMVerifier
from app.verifiers.reference import ReferenceVerifier
from app.verifiers.reward_model import RewardModelVerifier

__all__ = [
    "CodeTestsVerifier",
    "LLMJudgeVerifier",
    "LikelihoodVerifier",
    "PRMVerifier",
    "ParamLimits",
    "ReferenceVerifier",
    "RewardModelVerifier",
    "UnknownVerifierError",
    "Verifier",
    "VerifierError",
    "VerifierParams",
    "VerifyContext",
    "VerifyResult",
    "builtin_verifiers",
    "create_verifier",
]


def builtin_verifiers() -> dict[str, type[Verifier]]:
    """A fresh name -> class map of the built-in verifiers."""
    classes = (ReferenceVerifier, RewardModelVerifier, LLMJudgeVerifier, LikelihoodVerifier, CodeTestsVerifier,
               PRMVerifier)
    return {cls.name: cls for cls in classes}


def create_verifier(name: str, params: Mapping[str, Any] | None = None, limits: ParamLimits | None = None) -> Verifier:
    """A verifier by name with validated params, held to ``limits`` (the service's, for a client's params) on
    top of their static bounds.

    Raises :class:`UnknownVerifierError` for an unknown name and ``pydantic.ValidationError`` for
    bad params (unknown fields included).
    """
    registry = builtin_verifiers()
    try:
        cls = registry[name]
    except KeyError:
        raise UnknownVerifierError(f"unknown verifier {name!r}; known: {', '.join(sorted(registry))}") from None
    context = {"limits": limits} if limits is not None else None
    return cls(cls.Params.model_validate(dict(params or {}), context=context))
