"""Allocator state export: ``state_dict`` / ``load_state_dict`` round trips and exact continuation."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from allocators import Budget, Difficulty, DifficultyParams, QueryState, Sample, builtin_allocators, create


def finished(i: int, rng: random.Random, features: tuple[str, ...] = ("chars", "digits")) -> QueryState:
    """A finished query with random votes (and sometimes scores) over the named features."""
    feats = {name: float(rng.randint(0, 400)) for name in features}
    answers = [rng.choice("abc") for _ in range(rng.randint(1, 6))]
    scored = rng.random() < 0.3
    return QueryState(id=f"q{i}", cap=8, features=feats,
                      samples=[Sample(a, score=rng.random() if scored else None) for a in answers])


def diff(seed: int, **params: Any) -> Difficulty:
    return Difficulty(DifficultyParams.model_validate(params), random.Random(seed))


def via_json(state: dict[str, Any]) -> Any:
    return json.loads(json.dumps(state, allow_nan=False))


def test_difficulty_state_round_trips_through_json() -> None:
    alloc = diff(0)
    rng = random.Random(1)
    alloc.learn([finished(i, rng) for i in range(30)])
    state = alloc.state_dict()
    assert set(state) == {"bias", "weights", "seen", "rng"} and state["seen"] == 30
    assert set(state["weights"]) == {"chars", "digits"}
    twin = diff(99)
    twin.load_state_dict(via_json(state))
    assert twin.state_dict() == state
    assert json.dumps(twin.state_dict()) == json.dumps(state)


def test_loaded_state_continues_bit_identically() -> None:
    """``b.load_state_dict(a.state_dict())`` then the same learn calls: the same state, bit for bit,
    even when later examples bring features never seen (their weights come from the restored RNG)."""
    a, b = diff(0, learning_rate=0.2), diff(12345, learning_rate=0.2)
    rng = random.Random(2)
    a.learn([finished(i, rng) for i in range(50)])
    b.load_state_dict(via_json(a.state_dict()))
    later = [finished(i, rng, ("chars", "digits", "numbers", "operators")) for i in range(50, 120)]
    for st in later:
        a.learn([st])
        b.learn([st])
    assert a.state_dict() == b.state_dict()
    assert set(a.state_dict()["weights"]) == {"chars", "digits", "numbers", "operators"}
    probe = [QueryState(id=f"p{i}", cap=64, features=st.features) for i, st in enumerate(later[:8])]
    assert a.plan(probe, Budget(samples=40)) == b.plan(probe, Budget(samples=40))
    assert [a.predict(p) for p in probe] == [b.predict(p) for p in probe]


def test_the_rng_is_part_of_the_state() -> None:
    """Copying the model without the RNG diverges at the first new feature: the RNG state matters."""
    a, b = diff(0), diff(7)
    rng = random.Random(3)
    a.learn([finished(i, rng) for i in range(10)])
    state = a.state_dict()
    b.load_state_dict({**state, "rng": b.state_dict()["rng"]})
    assert {k: v for k, v in b.state_dict().items() if k != "rng"} == {k: v for k, v in state.items() if k != "rng"}
    new = finished(10, rng, ("chars", "numbers"))
    a.learn([new])
    b.learn([new])
    assert a.state_dict()["weights"]["numbers"] != b.state_dict()["weights"]["numbers"]
    assert a.state_dict()["bias"] != b.state_dict()["bias"]  # the new weight changed p, hence the step


def test_the_rng_is_restored_in_place() -> None:
    alloc = diff(0)
    source = diff(5)
    source.learn([finished(0, random.Random(4))])
    alloc.load_state_dict(source.state_dict())
    assert alloc.rng is alloc.model.rng
    assert alloc.rng.getstate() == source.rng.getstate()


@pytest.mark.parametrize("bad", [
    {},
    {"bias": 0.0, "weights": {}, "seen": 0},
    {"bias": "0", "weights": {}, "seen": 0, "rng": None},
    {"bias": float("nan"), "weights": {}, "seen": 0, "rng": None},
    {"bias": 0.0, "weights": {"x": "1"}, "seen": 0, "rng": None},
    {"bias": 0.0, "weights": {}, "seen": -1, "rng": None},
    {"bias": 0.0, "weights": {}, "seen": True, "rng": None},
    {"bias": 0.0, "weights": {}, "seen": 0, "rng": [3, [1, 2, 3], None]},
    {"bias": 0.0, "weights": {}, "seen": 0, "rng": "state"},
    {"bias": 0.0, "weights": {}, "seen": 0, "extra": 1, "rng": None},
])
def test_malformed_difficulty_state_is_refused_and_changes_nothing(bad: dict[str, Any]) -> None:
    alloc = diff(0)
    alloc.learn([finished(0, random.Random(5))])
    before = alloc.state_dict()
    with pytest.raises(ValueError):
        alloc.load_state_dict(bad)
    assert alloc.state_dict() == before


def test_bad_gauss_next_is_refused() -> None:
    alloc = diff(0)
    version, internal, _ = alloc.state_dict()["rng"]
    with pytest.raises(ValueError, match="rng"):
        alloc.load_state_dict({**alloc.state_dict(), "rng": [version, internal, "x"]})


def test_every_builtin_round_trips_its_state_and_stateless_ones_refuse_state() -> None:
    for name in builtin_allocators():
        alloc = create(name, None, random.Random(0))
        state = via_json(alloc.state_dict())
        create(name, None, random.Random(1)).load_state_dict(state)  # its own export always loads
        if not alloc.shared:
            assert state == {}
            alloc.load_state_dict({})
            with pytest.raises(ValueError, match="keeps no state"):
                alloc.load_state_dict({"bias": 0.0})
