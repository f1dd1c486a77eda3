"""The live display every trainer shares: load the target with a spinner, then one rich bar per stage.

Trainers report progress through one callback, `progress(stage, done, total, fields)`, so the training code
never imports rich and tests can pass a no-op.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

ProgressFn = Callable[[str, int, int, dict], None]


def load_target(target: str, device: Any, console: Console) -> Any:
    from specdec.models.loader import load_model

    with console.status(f"loading {target}..."):
        return load_model(target, device, "float32", show_progress=True)


@contextmanager
def stage_bars(console: Console, labels: dict[str, str]) -> Iterator[tuple[Progress, ProgressFn]]:
    """Yields the rich Progress (for `bars.console.print` logging) and the stage callback for trainers."""
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
    with Progress(*columns, console=console) as bars:
        tasks: dict[str, int] = {}

        def progress(stage: str, done: int, total: int, fields: dict) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(labels.get(stage, stage), total=total, info="")
            info = "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items())
            bars.update(tasks[stage], completed=done, total=total, **({"info": info} if info else {}))

        yield bars, progress
