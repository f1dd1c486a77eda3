"""PNG charts of acceptance reports. matplotlib is optional (`pip install 'specdec[bench]'`), so it is imported
only here, and only through `matplotlib.figure.Figure`: no pyplot, so a user's interactive backend is never
switched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdec.errors import ConfigError

# Reports arrive duck-typed (an `AcceptanceReport` has .alpha_by_depth, .label, ...): report.py imports this
# module lazily for its `plot` method, and this module never imports report.py, so imports point one way.
AcceptanceReport = Any


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("plotting needs matplotlib: pip install 'specdec[bench]' (or save JSON/CSV only)") from None
    return Figure(figsize=(width, height), layout="constrained")


def plot_report(report: AcceptanceReport, path: Path) -> Path:
    """Three panels: alpha by depth, acceptance by sibling rank per depth, histogram of accepted lengths."""
    fig = _figure(14, 4)
    by_depth, by_rank, hist = fig.subplots(1, 3)
    s = report.stats
    depths = list(range(1, len(s.alpha_by_depth) + 1))
    by_depth.bar(depths, s.alpha_by_depth, color="tab:blue")
    for d, (alpha, offered) in enumerate(zip(s.alpha_by_depth, s.depth_offered), start=1):
        by_depth.text(d, alpha, f"n={offered}", ha="center", va="bottom", fontsize=7)
    by_depth.set(xlabel="depth d", ylabel="alpha_d", ylim=(0, 1.1), title="acceptance by depth")
    for d, ranks in enumerate(s.acceptance_by_rank, start=1):
        by_rank.plot(range(len(ranks)), ranks, marker="o", label=f"depth {d}")
    by_rank.set(xlabel="sibling rank", ylabel="P(accepted | parent accepted)", ylim=(0, 1.05),
                title="acceptance by rank")
    if s.acceptance_by_rank:
        by_rank.set_xticks(range(max(len(r) for r in s.acceptance_by_rank)))
        by_rank.legend(fontsize=7)
    hist.bar(range(len(s.accepted_hist)), s.accepted_hist, color="tab:green")
    hist.set(xlabel="drafted tokens accepted in a step", ylabel="steps", title="accepted lengths")
    fig.suptitle(f"{report.settings.target}: {report.label}   tau={s.tau:.2f}   "
                 f"draft share {100 * s.draft_fraction:.0f}%")
    fig.savefig(path, dpi=110)
    return path


def plot_sweep(reports: list[AcceptanceReport], path: Path) -> Path:
    """Two panels: tau of every configuration, and alpha by depth of each."""
    fig = _figure(14, max(4, 0.3 * len(reports) + 2))
    taus, alphas = fig.subplots(1, 2)
    labels = [r.label for r in reports]
    taus.barh(range(len(reports)), [r.tau for r in reports], color="tab:blue")
    taus.set_yticks(range(len(reports)), labels, fontsize=7)
    taus.invert_yaxis()
    taus.set(xlabel="tau (tokens per target step)", title="tau")
    for r in reports:
        alpha = r.alpha_by_depth
        alphas.plot(range(1, len(alpha) + 1), alpha, marker="o", label=r.label)
    alphas.set(xlabel="depth d", ylabel="alpha_d", ylim=(0, 1.05), title="acceptance by depth")
    alphas.legend(fontsize=6)
    fig.suptitle(f"acceptance sweep on {reports[0].settings.target}")
    fig.savefig(path, dpi=110)
    return path
