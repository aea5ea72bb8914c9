"""Accuracy and coverage against mean samples for the policy, uniform and the oracle (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.replay.evaluator import Report
    from app.replay.summary import Row

_STYLES = {"policy": ("o-", "tab:blue"), "uniform": ("s--", "tab:gray"), "oracle": ("^:", "tab:green")}


def plot_report(report: Report, path: str | Path) -> Path:
    """Write a two-panel PNG (accuracy, coverage vs mean samples, 95% intervals as error bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    series: dict[str, list[Row]] = {"policy": report.rows, "uniform": report.uniform, "oracle": report.oracle}
    label = {"policy": report.policy.name, "uniform": "uniform (majority)", "oracle": "oracle"}
    for ax, metric in zip(axes, ("accuracy", "coverage"), strict=True):
        if metric == "accuracy" and len(report.uniform_curve[0]) > 1:
            cx, cy = report.uniform_curve
            ax.plot(cx[1:], cy[1:], "-", color="lightgray", lw=1, zorder=0, label="uniform, every budget")
        for key, rows in series.items():
            style, color = _STYLES[key]
            xs = [r.mean_samples for r in rows]
            ys = [getattr(r, metric) for r in rows]
            cis = [getattr(r, f"{metric}_ci") for r in rows]
            err = [[y - lo for y, (lo, _) in zip(ys, cis, strict=True)],
                   [hi - y for y, (_, hi) in zip(ys, cis, strict=True)]]
            ax.errorbar(xs, ys, yerr=err, fmt=style, color=color, capsize=3, label=label[key])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("mean samples per problem")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} ({report.n_problems} problems, {report.seeds} seeds)")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
