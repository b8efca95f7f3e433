"""What a finished training run records, whichever backend trained it (finish.py: torch; ort_finish.py: ORT).

    outcome = Outcome(progress, test, wall_s, cpu_s, samples_per_s)
    golden = golden_record(len(splits.test))              # how much of the test split golden.npz holds
    summary = outcome.summary(recipe, {...})              # reports/train.json
    manifest.stages.train = outcome.record(recipe, splits, golden=golden, ...)   # the manifest's TrainRecord

Both backends fill the same fields from the same sources; only what differs between them (the
backend, its device and framework, the checkpoint files) is passed in.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

from pipeline.artifact.records import CheckpointRecord, GoldenRecord, TrainRecord
from pipeline.data import Splits
from pipeline.recipe.schema import Recipe, stage_settings
from pipeline.train.loop import Progress
from pipeline.train.objective import kept_reason

GOLDEN_WHOLE_SPLIT_MAX = 1000  # test splits up to this size go into golden.npz whole
GOLDEN_SAMPLES = 512  # otherwise the first this many test samples


def golden_record(test_size: int) -> GoldenRecord:
    """golden.npz's rows of the test split: all of a small one, the first GOLDEN_SAMPLES of a large one."""
    whole = test_size <= GOLDEN_WHOLE_SPLIT_MAX
    samples = test_size if whole else GOLDEN_SAMPLES
    return GoldenRecord(split="test", samples=samples, whole_split=whole, split_size=test_size)


@dataclass(frozen=True)
class Outcome:
    """How a training run ended: its progress (the kept epoch, the history), the kept weights' test figures,
    and its speed."""

    progress: Progress
    test: dict[str, float]  # the kept epoch's figures on the test split: the manifest's metrics
    wall_s: float
    cpu_s: float  # process CPU time over the loop
    samples_per_s: float

    def kept(self, recipe: Recipe) -> str:
        """Which epoch's weights are kept and why (objective.kept_reason)."""
        cfg = recipe.train
        return kept_reason(cfg.monitor, self.progress, cfg.epochs, cfg.early_stopping)

    def summary(self, recipe: Recipe, extra: dict[str, Any]) -> dict[str, Any]:
        """reports/train.json: the outcome, the backend's `extra` figures, then the per-epoch history."""
        p, monitor = self.progress, recipe.train.monitor
        return {
            "test": self.test,
            "best_epoch": p.best_epoch,
            "monitor": monitor,  # the validation figure that chose best_epoch (ties: the lower val_loss)
            f"best_{monitor}": p.best_metric,
            "best_val_loss": p.best_loss,
            "kept": self.kept(recipe),
            "epochs_run": p.epoch,
            "steps": p.step,
            "stopped_early": p.stopped_early,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "samples_per_s": self.samples_per_s,
            **extra,
            "history": p.history,
        }

    def record(
        self,
        recipe: Recipe,
        splits: Splits,
        *,
        inputs: dict[str, str],
        recipe_path: str | None,
        checkpoint: CheckpointRecord,
        golden: GoldenRecord,
        backend: str,
        device: str,
        precision: str,
        framework: str,
        world_size: int = 1,
        strategy: str = "single",
        parameters: dict[str, int] | None = None,
    ) -> TrainRecord:
        """The manifest's train record: the recipe's sections as trained (enough to rebuild the model), what
        the run read (`inputs` digests), where its weights and checkpoint are, and how it ended."""
        p = self.progress
        return TrainRecord(
            settings=stage_settings(recipe, "train"),
            inputs=inputs,
            recipe_path=recipe_path,  # where `pipe export` reads its section now
            data=splits.info.to_dict(),  # the data-shape record build_model takes
            checkpoint=checkpoint,
            golden=golden,
            splits={"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)},
            backend=backend,
            device=device,
            precision=precision,
            world_size=world_size,
            strategy=strategy,
            framework=framework,
            python=platform.python_version(),
            best_epoch=p.best_epoch,
            kept=self.kept(recipe),
            epochs_run=p.epoch,
            steps=p.step,
            stopped_early=p.stopped_early,
            wall_s=self.wall_s,
            cpu_s=self.cpu_s,
            samples_per_s=self.samples_per_s,
            parameters=parameters or {},
        )
