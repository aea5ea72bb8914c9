"""The configurations in ``examples/`` load, and every policy they declare is one the service accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import REPO_ROOT, load_settings
from app.policy import parse_spec, validate_spec

EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"config.yaml", "prm-qwen-math.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_config_loads_with_valid_policies(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VLLM_API_KEY", "TTC_ADMIN_KEY"):  # the secrets an example names by reference
        monkeypatch.setenv(name, "unused")
    settings = load_settings(path)
    assert settings.policies
    for name, body in settings.policies.items():
        spec = parse_spec({k: v for k, v in body.items() if k != "description"}, where=f"policies.{name}")
        validate_spec(spec, where=f"policies.{name}")
