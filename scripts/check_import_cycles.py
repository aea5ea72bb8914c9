"""Fail when the modules of ``app`` and ``allocators`` import each other in a cycle.

Every import counts, ``TYPE_CHECKING`` and function-level ones included (grimp's import graph, the one
import-linter uses). A package's ``__init__`` importing its own submodules is not a cycle unless a
submodule imports the package back. Run by ``make lint``.
"""

from __future__ import annotations

import sys

import grimp


def cycles(packages: tuple[str, ...]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    graph = grimp.build_graph(*packages)
    nodes = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & graph.modules) for m in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 10_000))  # the depth of an import chain
    try:
        for node in nodes:
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(old_limit)
    return out


def main() -> int:
    found = cycles(("app", "allocators"))
    for component in found:
        print("import cycle among: " + ", ".join(component))
    if not found:
        print("no import cycles in app, allocators")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
