"""Answers: extraction, answer kinds, canonical vote keys and equivalence.

* :mod:`app.answers.extract`: bounded, linear-time extraction and cheap normal forms (event loop);
* :mod:`app.answers.kinds` / :mod:`app.answers.structured`: the answer kinds (:class:`AnswerSpec`);
* :mod:`app.answers.mathparse`: math-verify behind limits (worker processes only);
* :mod:`app.answers.pool`: the bounded worker-process pool;
* :mod:`app.answers.canon`: :class:`QueryCanon`, one query's keys with the slow work off the loop.
"""

from app.answers.canon import AnswerRuntime, QueryCanon
from app.answers.extract import extract_answer, normalize_text, number_key
from app.answers.kinds import KIND_NAMES, AnswerKind, Deferred
from app.answers.mathparse import equivalent
from app.answers.pool import ParsePool, PoolBusy, PoolError, PoolTimeout
from app.answers.spec import AnswerSpec, KindFactory, kind_classes, kind_factory

__all__ = [
    "KIND_NAMES",
    "AnswerKind",
    "AnswerRuntime",
    "AnswerSpec",
    "Deferred",
    "KindFactory",
    "ParsePool",
    "PoolBusy",
    "PoolError",
    "PoolTimeout",
    "QueryCanon",
    "equivalent",
    "extract_answer",
    "kind_classes",
    "kind_factory",
    "normalize_text",
    "number_key",
]
