"""AcceptanceReport: what one acceptance experiment measured, with the settings that reproduce it.

A report is settings + raw counts (overall and per prompt category); every rate is derived from the counts.
It saves to JSON (and loads back), to CSV (one row per scope: "all", then each category) and plots to PNG.
A sweep is a list of reports; `save_reports` writes it as one JSON, one CSV and one PNG.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.errors import ConfigError
from specdec.experiments.stats import AcceptanceStats

FORMAT_VERSION = 1


@dataclass
class ExperimentSettings:
    """Everything needed to run the experiment again."""

    target: str
    drafter: str
    tree: str
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    num_prompts: int = 0
    max_new_tokens: int = 0
    quantize: str | None = None
    device: str = "cpu"
    adaptive: bool = False  # the engine's adaptive speculation was on (trees cut per step)


@dataclass
class AcceptanceReport:
    settings: ExperimentSettings
    stats: AcceptanceStats  # every prompt together
    categories: dict[str, AcceptanceStats] = field(default_factory=dict)  # when prompts carry a "category"
    wall_time_s: float = 0.0  # the whole generate call, batched

    # -------------------------------------------------------------------------------------- shortcuts
    @property
    def label(self) -> str:
        s = self.settings
        return f"{s.drafter} | {s.tree} | T={s.temperature:g}"

    @property
    def tau(self) -> float:
        return self.stats.tau

    @property
    def alpha_by_depth(self) -> list[float]:
        return self.stats.alpha_by_depth

    @property
    def acceptance_by_rank(self) -> list[list[float]]:
        return self.stats.acceptance_by_rank

    @property
    def accepted_length_hist(self) -> list[int]:
        return self.stats.accepted_hist

    @property
    def draft_time_s(self) -> float:
        return self.stats.draft_time_s

    @property
    def verify_time_s(self) -> float:
        return self.stats.verify_time_s

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over the wall time of the batched run (prefill included)."""
        return self.stats.generated_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    # ------------------------------------------------------------------------------------------- json
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "settings": self.settings.__dict__.copy(),
            "summary": {**self.stats.summary(), "tokens_per_second": self.tokens_per_second,
                        "wall_time_s": self.wall_time_s,
                        "categories": {name: s.summary()["tau"] for name, s in self.categories.items()}},
            "stats": self.stats.to_dict(),
            "categories": {name: s.to_dict() for name, s in self.categories.items()},
            "wall_time_s": self.wall_time_s,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "AcceptanceReport":
        try:
            settings = ExperimentSettings(**data["settings"])
            return AcceptanceReport(settings, AcceptanceStats.from_dict(data["stats"]),
                                    {k: AcceptanceStats.from_dict(v) for k, v in data.get("categories", {}).items()},
                                    float(data.get("wall_time_s", 0.0)))
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"not an acceptance report: {exc}") from None

    def save_json(self, path: str | Path) -> Path:
        path = _ready(path)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @staticmethod
    def load_json(path: str | Path) -> "AcceptanceReport":
        return AcceptanceReport.from_dict(_read_json(path))

    # -------------------------------------------------------------------------------------------- csv
    def rows(self) -> list[dict[str, Any]]:
        """One flat row for all prompts, then one per category."""
        scopes = [("all", self.stats), *sorted(self.categories.items())]
        return [self._row(scope, stats) for scope, stats in scopes]

    def _row(self, scope: str, s: AcceptanceStats) -> dict[str, Any]:
        row: dict[str, Any] = {
            **self.settings.__dict__, "scope": scope, "requests": s.requests, "steps": s.steps, "tokens": s.tokens,
            "tau": round(s.tau, 4), "mean_tree_nodes": round(s.mean_tree_nodes, 3),
            "draft_time_s": round(s.draft_time_s, 4), "verify_time_s": round(s.verify_time_s, 4),
            "draft_fraction": round(s.draft_fraction, 4),
        }
        if scope == "all":
            row["tokens_per_second"] = round(self.tokens_per_second, 3)
            row["wall_time_s"] = round(self.wall_time_s, 3)
        for d, alpha in enumerate(s.alpha_by_depth, start=1):
            row[f"alpha_d{d}"] = round(alpha, 4)
        for d, ranks in enumerate(s.acceptance_by_rank, start=1):
            for r, p in enumerate(ranks):
                row[f"p_d{d}_r{r}"] = round(p, 4)
        for a, n in enumerate(s.accepted_hist):
            row[f"hist_{a}"] = n
        return row

    def save_csv(self, path: str | Path) -> Path:
        return write_csv([self], path)

    # ------------------------------------------------------------------------------------------- plot
    def plot(self, path: str | Path) -> Path:
        from specdec.experiments.plot import plot_report

        return plot_report(self, _ready(path))


def save_reports(reports: list[AcceptanceReport], stem: str | Path, plot: bool = True) -> dict[str, Path]:
    """Write a sweep as `<stem>.json`, `<stem>.csv` and (with `plot`) `<stem>.png`."""
    stem = Path(stem)
    if not reports:
        raise ConfigError("no reports to save")
    json_path = _ready(stem.with_suffix(".json"))
    json_path.write_text(json.dumps({"format": FORMAT_VERSION, "reports": [r.to_dict() for r in reports]},
                                    indent=1) + "\n")
    out = {"json": json_path, "csv": write_csv(reports, stem.with_suffix(".csv"))}
    if plot:
        from specdec.experiments.plot import plot_sweep

        out["png"] = plot_sweep(reports, _ready(stem.with_suffix(".png")))
    return out


def load_reports(path: str | Path) -> list[AcceptanceReport]:
    """Read a sweep file (or a single report file) back."""
    data = _read_json(path)
    if isinstance(data, dict) and "reports" in data:
        return [AcceptanceReport.from_dict(r) for r in data["reports"]]
    return [AcceptanceReport.from_dict(data)]


def write_csv(reports: list[AcceptanceReport], path: str | Path) -> Path:
    rows = [row for report in reports for row in report.rows()]
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    path = _ready(path)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _ready(path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no report file at {path}")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ConfigError(f"cannot read report {path}: {exc}") from None
