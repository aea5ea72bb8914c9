"""A checked sandbox for tests that execute code (``make test`` installs bubblewrap)."""

from __future__ import annotations

import pytest

from app.sandbox import Sandbox, SandboxConfig, SandboxUnavailable


def ready_sandbox(config: SandboxConfig | Sandbox | None = None) -> Sandbox:
    """A :class:`Sandbox` (built from ``config``, or the one given) that has passed its probe; the test
    fails (never skips) when it cannot."""
    sandbox = config if isinstance(config, Sandbox) else Sandbox(config or SandboxConfig())
    try:
        sandbox.check()
    except SandboxUnavailable as e:
        pytest.fail(f"{e} (scripts/test-services.sh installs bubblewrap; make test-fast leaves these tests out)")
    return sandbox
