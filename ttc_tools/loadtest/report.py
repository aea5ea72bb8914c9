"""Report files of a load test: a rich table, JSON, CSV, two PNG plots and one self-contained HTML.

Files written into ``out_dir``:

* ``summary.json`` — run metadata plus one row per policy × load level (:class:`LevelSummary`);
* ``summary.csv`` — the same rows (dict columns as JSON strings);
* ``requests.csv`` — one row per request (:class:`RequestRecord`, without the returned text);
* ``pareto.png`` — accuracy (95 % bootstrap interval) against mean completion tokens per query,
  one point per policy × level, with the Pareto front (no other point is both cheaper and at least
  as accurate) drawn as a step line;
* ``latency_vs_load.png`` — p99 latency against offered load, one line per policy: closed-loop
  levels against their concurrency, open-loop levels against their Poisson rate (one panel each);
  levels without a successful request are left out of both plots (they measured nothing);
* ``report.html`` — the table and both plots (PNG embedded as base64), no external resources.
"""

from __future__ import annotations

import base64
import csv
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from ttc_tools.loadtest.records import RequestRecord
from ttc_tools.loadtest.stats import LevelSummary, level_label

TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("policy", "policy"), ("mode", "mode"), ("load", "load"), ("requests", "reqs"), ("failed", "failed"),
    ("throughput_rps", "rps"), ("latency_p50_ms", "p50 ms"), ("latency_p90_ms", "p90 ms"),
    ("latency_p99_ms", "p99 ms"), ("latency_max_ms", "max ms"), ("ttfb_p50_ms", "ttfb p50"),
    ("samples_per_query", "samples/q"), ("tokens_per_query", "tokens/q"),
    ("backend_tokens_per_query", "vLLM tok/q"), ("accuracy", "acc"),
    ("accuracy_ci", "acc 95% CI"), ("errors", "errors"),
)


def _cell(row: dict[str, Any], key: str) -> str:
    if key == "accuracy_ci":
        if row["accuracy_ci_low"] is None:
            return "-"
        return f"[{row['accuracy_ci_low']:.3f}, {row['accuracy_ci_high']:.3f}]"
    value = row[key]
    if value is None:
        return "-"
    if key == "errors":
        text = ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
        if row.get("failed_after_kill") is not None:
            text += f" (after kill: {row['failed_after_kill']})"
        return text
    if key == "accuracy":
        return f"{value:.3f}"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 or key == "load" else f"{value:.2f}"
    return str(value)


def summary_table(summaries: Sequence[LevelSummary], title: str = "Load test") -> Table:
    table = Table(title=title)
    for _, header in TABLE_COLUMNS:
        table.add_column(header, justify="left" if header in ("policy", "mode", "errors") else "right")
    for s in summaries:
        row = s.row()
        table.add_row(*(_cell(row, key) for key, _ in TABLE_COLUMNS))
    return table


def error_table(summaries: Sequence[LevelSummary]) -> Table | None:
    """Failed requests by level and error type (``http_<status>[:code]``, ``timeout``, ...), with the
    first message seen for each; ``None`` when nothing failed."""
    failing = [s for s in summaries if s.errors]
    if not failing:
        return None
    table = Table(title="Failed requests", show_lines=False)
    for header, justify in (("level", "left"), ("error", "left"), ("count", "right"), ("example message", "left")):
        table.add_column(header, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for s in failing:
        for i, (kind, count) in enumerate(sorted(s.errors.items(), key=lambda kv: -kv[1])):
            table.add_row(Text(f"{level_label(s)} ({s.failed} of {s.requests} failed)" if i == 0 else ""),
                          Text(kind), str(count), Text(s.error_examples.get(kind, "")),
                          end_section=i == len(s.errors) - 1)
    return table


def _measured(summaries: Sequence[LevelSummary]) -> list[LevelSummary]:
    """The levels with at least one successful (and, for accuracy, scored) request: the only ones plotted."""
    return [s for s in summaries if s.ok > 0]


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated points (minimise x = cost, maximise y = accuracy), by cost.
    A point is dropped when another costs no more and is at least as accurate, one of them strictly."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front: list[int] = []
    best = float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def plot_pareto(summaries: Sequence[LevelSummary], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    summaries = [s for s in _measured(summaries) if s.scored > 0]
    pts = [(s.tokens_per_query, s.accuracy) for s in summaries]
    for policy in dict.fromkeys(s.policy for s in summaries):
        mine = [s for s in summaries if s.policy == policy]
        ax.errorbar([s.tokens_per_query for s in mine], [s.accuracy for s in mine],
                    yerr=[[s.accuracy - s.accuracy_ci_low for s in mine],
                          [s.accuracy_ci_high - s.accuracy for s in mine]],
                    fmt="o", capsize=3, label=policy)
    front = pareto_front(pts)
    if front:
        ax.step([pts[i][0] for i in front], [pts[i][1] for i in front], where="post", color="grey",
                linestyle="--", marker="o", markersize=12, markerfacecolor="none", label="Pareto front")
    ax.set_xlabel("completion tokens per query (mean)")
    ax.set_ylabel("accuracy (95% bootstrap CI)")
    ax.set_title("Accuracy vs tokens per query")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(summaries: Sequence[LevelSummary], path: Path) -> None:
    """p99 latency against offered load: closed-loop levels against their concurrency (clients),
    open-loop levels against their arrival rate (requests/s), one panel each when both are present."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summaries = _measured(summaries)
    modes = [m for m in ("closed", "open") if any(s.mode == m for s in summaries)] or ["closed"]
    fig, axes = plt.subplots(1, len(modes), figsize=(6.5 * len(modes), 4.5), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        for policy in dict.fromkeys(s.policy for s in summaries if s.mode == mode):
            mine = sorted((s for s in summaries if (s.policy, s.mode) == (policy, mode)), key=lambda s: s.load)
            ax.plot([s.load for s in mine], [s.latency_p99_ms for s in mine], marker="o", label=policy)
        ax.set_xlabel("concurrent clients (closed loop)" if mode == "closed" else "arrival rate, req/s (open loop)")
        if mode == "closed":
            ax.set_xscale("log", base=2)
        ax.set_ylabel("p99 latency (ms)")
        ax.set_title(f"p99 latency vs offered load ({mode} loop)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        path.write_text("")
        return
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in row.items()})


def _html(summaries: Sequence[LevelSummary], meta: dict[str, Any], images: dict[str, Path]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in TABLE_COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(s.row(), k))}</td>" for k, _ in TABLE_COLUMNS) + "</tr>"
        for s in summaries)
    imgs = "".join(
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}"/></figure>' for name, p in images.items())
    errors = "".join(
        f"<tr><td>{html.escape(level_label(s))}</td><td>{html.escape(kind)}</td><td>{count}</td>"
        f"<td style='text-align:left'>{html.escape(s.error_examples.get(kind, ''))}</td></tr>"
        for s in summaries for kind, count in sorted(s.errors.items(), key=lambda kv: -kv[1]))
    if errors:
        errors = ("<h2>Failed requests</h2><table><tr><th>level</th><th>error</th><th>count</th>"
                  f"<th>example message</th></tr>{errors}</table>")
    meta_html = html.escape(json.dumps(meta, indent=2, default=str))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>ttc load test</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#eee}"
        "figure{display:inline-block;margin:1em}pre{background:#f6f6f6;padding:1em}</style></head>"
        f"<body><h1>ttc load test</h1>{errors}<table><tr>{head}</tr>{body}</table>{imgs}"
        f"<h2>Run</h2><pre>{meta_html}</pre></body></html>")


def write_reports(out_dir: Path, summaries: Sequence[LevelSummary], records: Sequence[RequestRecord],
                  meta: dict[str, Any]) -> dict[str, Path]:
    """Write every report file (see the module docstring) and return them by name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {name: out_dir / name for name in (
        "summary.json", "summary.csv", "requests.csv", "pareto.png", "latency_vs_load.png", "report.html")}
    rows = [s.row() for s in summaries]
    files["summary.json"].write_text(json.dumps({"meta": meta, "levels": rows}, indent=2, default=str))
    _write_csv(files["summary.csv"], rows)
    _write_csv(files["requests.csv"], [{k: v for k, v in r.row().items() if k != "content"} for r in records])
    plot_pareto(summaries, files["pareto.png"])
    plot_latency(summaries, files["latency_vs_load.png"])
    images = {"pareto": files["pareto.png"], "latency": files["latency_vs_load.png"]}
    files["report.html"].write_text(_html(summaries, meta, images), encoding="utf-8")
    return files
