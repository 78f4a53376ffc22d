"""Weights & Biases through the `wandb` client: one W&B run per grpo run, grouped by experiment
(a sweep's members share the group). WANDB_MODE=offline writes under <experiment>/wandb/ for a
later `wandb sync`. The run id is derived from the run directory, so a resumed run continues its
W&B run."""

from __future__ import annotations

import hashlib
from pathlib import Path

import wandb


class WandbBackend:
    name = "wandb"

    def __init__(self, identity, project: str, entity: str | None = None):
        run_id = hashlib.sha1(str(identity.run_dir.resolve()).encode()).hexdigest()[:16]
        self.run = wandb.init(
            project=project, entity=entity, group=identity.experiment, name=identity.name,
            id=run_id, resume="allow", job_type="train", config=identity.params,
            dir=str(identity.run_dir.parent), settings=wandb.Settings(console="off", silent=True),
        )
        # grpo steps come out of order across kinds (eval rows count steps completed): one x-axis
        self.run.define_metric("grpo_step")
        self.run.define_metric("*", step_metric="grpo_step")
        self.where = (f"offline, {Path(self.run.dir).parent} (`wandb sync` uploads it)"
                      if self.run.offline else self.run.url)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log({"grpo_step": step, **values})

    def text(self, step: int, tag: str, text: str) -> None:
        self.run.log({"grpo_step": step, tag: wandb.Html(f"<pre>{text}</pre>")})

    def figures(self, paths: list[Path]) -> None:
        self.run.log({f"figures/{path.stem}": wandb.Image(str(path)) for path in paths})

    def close(self, status: str) -> None:
        self.run.summary["status"] = status
        self.run.finish(exit_code=0 if status == "completed" else 1)
