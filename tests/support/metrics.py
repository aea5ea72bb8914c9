"""Reading Prometheus text in tests: the value of a sample, never the mere presence of a name
(prometheus-client prints HELP/TYPE lines for series that have no samples)."""

from __future__ import annotations

import re


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of every sample of ``name`` whose labels include ``labels`` (0 when there is none)."""
    total = 0.0
    for line in text.splitlines():
        m = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total
