"""The answer spec of a policy or request, and the registry of kinds (see :mod:`app.answers.kinds`)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.answers.kinds import (
    AnswerKind,
    AutoKind,
    JsonKind,
    KindName,
    KindParams,
    MathKind,
    NoneKind,
    NumberKind,
    TextKind,
)
from app.answers.structured import ChoiceKind, CodeKind, RegexKind, ToolCallKind


def kind_classes() -> dict[str, type[AnswerKind]]:
    """A fresh name -> class map of every kind."""
    classes = (AutoKind, NumberKind, MathKind, TextKind, JsonKind, NoneKind, ChoiceKind, RegexKind, CodeKind,
               ToolCallKind)
    return {cls.name: cls for cls in classes}


class AnswerSpec(BaseModel):
    """How answers are extracted and compared: a kind and its params."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
    kind: KindName = Field("auto", description="auto | number | math | choice | code | regex | json | text | "
                                               "tool_call | none")
    params: dict[str, Any] = Field(default_factory=dict, description="Params of the kind (see the README)")

    @field_validator("params")
    @classmethod
    def _small(cls, v: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(v, default=str)) > 65_536:
            raise ValueError("answer params are limited to 64 KiB")
        return v

    def validated_params(self) -> KindParams:
        """The kind's params model (raises ``pydantic.ValidationError`` on bad params)."""
        return kind_classes()[self.kind].Params.model_validate(self.params)


KindFactory = Callable[[str], AnswerKind]
"""Builds one query's answer kind from its prompt text."""


def kind_factory(spec: AnswerSpec | None) -> KindFactory:
    """What builds the kind of ``spec`` (``auto`` when ``None``) for one query, given its prompt text. The
    params are validated here, once (raises ``pydantic.ValidationError``); every kind it builds shares
    them (they are frozen)."""
    spec = spec or AnswerSpec()
    return functools.partial(kind_classes()[spec.kind], spec.validated_params())
