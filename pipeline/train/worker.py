"""Entry point of one torchrun worker started by `pipe train --nproc N` (not a user-facing command).

python -m torch.distributed.run ... -m pipeline.train.worker PLAN_JSON VERSION_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pipeline.core.errors import PipelineError


def main(argv: list[str]) -> int:
    from pipeline.data import load_splits
    from pipeline.recipe.file import load_recipe
    from pipeline.train.checkpoint import latest_checkpoint
    from pipeline.train.stage import Plan, effective_recipe, train_in_process

    plan = Plan(**json.loads(argv[0]))
    root = Path(argv[1])
    try:
        recipe = effective_recipe(load_recipe(plan.recipe_path), plan.epochs)
        resume = latest_checkpoint(root) is not None  # the launcher chose this folder to resume
        train_in_process(plan, recipe, load_splits(recipe), root.parent, resume=resume, root=root)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Leave without running C++ static destructors: under load, gloo's threads aborted a worker at
    # interpreter shutdown ("terminate called without an active exception", no Python frame left)
    # after training and the artifact were complete, and torchrun then failed the whole run.
    # Everything worth keeping is written and fsynced by now; flush what was printed and go.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
