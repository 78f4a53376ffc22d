"""A progress bar over optimizer steps showing reward and held-out accuracy (rich)."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class StepProgress:
    def __init__(self, total: int, start: int, enabled: bool = True, label: str = "grpo"):
        self.enabled = enabled
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reward {task.fields[reward]}  acc {task.fields[accuracy]}"),
            TimeRemainingColumn(),
            disable=not enabled,
        )
        self.task_id = self.progress.add_task(
            label, total=total, completed=start, reward="-", accuracy="-"
        )

    def __enter__(self) -> StepProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def advance(self, reward: float, accuracy: float | None) -> None:
        self.progress.update(
            self.task_id,
            advance=1,
            reward=f"{reward:.3f}",
            accuracy="-" if accuracy is None else f"{accuracy:.3f}",
        )
