"""The module structure holds: import-linter's contracts (pyproject) and no import cycle at all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    out = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_no_import_cycles_even_through_type_checking_imports() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from check_import_cycles import cycles
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert cycles(("app", "allocators")) == []


def test_the_service_uses_the_allocators_public_surface_only() -> None:
    """``app`` imports ``allocators`` by its top level (the pinned ``__all__``), never a submodule."""
    import grimp

    graph = grimp.build_graph("app", "allocators")
    inner = sorted(
        (importer, imported) for imported in graph.find_children("allocators")
        for importer in graph.find_modules_that_directly_import(imported) if importer.split(".")[0] == "app")
    assert inner == []
