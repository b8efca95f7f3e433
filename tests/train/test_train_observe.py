"""The run's metrics stream: a resumed run rewrites the steps after its checkpoint, torn lines included."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.train.observe import METRICS_FILE, Monitor


def test_resume_drops_records_after_the_checkpoint_and_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    path.parent.mkdir(parents=True)
    lines = [json.dumps({"kind": "train", "step": s, "loss": 1.0 / s}) for s in range(1, 6)]
    path.write_text("\n".join(lines) + '\n{"kind": "train", "st')  # killed in the middle of a write
    monitor = Monitor(tmp_path, enabled=True, resume_step=3, quiet=True)
    monitor.log({"kind": "train", "step": 4, "loss": 0.2})
    monitor.close()
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
