"""How a stage writes into an artifact: scratch -> gate -> stamp -> move -> record -> save.

    with StageWrite(root, "export") as write:
        candidate = write.scratch / "model.onnx"      # 1. make files in a scratch directory
        ...gate, stamp...                             # 2-3. verify and stamp them there
        write.commit(["model.onnx"], record)          # 4-6. under the lock: move, record, save

The slow part (exporting, quantizing, converting, verifying) runs outside the lock, so two stages
on one version (CI runs optimize and edge in parallel) work side by side. `commit` then takes the
artifact's lock, re-reads the manifest as it is now (another stage may have saved since), moves
the files into place, lets the stage record itself on that fresh manifest, and saves it
atomically: neither stage's record is lost. Anything that fails before `commit` leaves the
artifact exactly as it was; the scratch directory is always removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from pipeline.artifact.directory import Artifact, locked
from pipeline.core.fsutil import fsync_dir


class StageWrite:
    """One stage's write into the artifact at `root`; see the module doc."""

    def __init__(self, root: Path, stage: str) -> None:
        self.root = Path(root)
        self.stage = stage
        self.scratch = Path()

    def __enter__(self) -> StageWrite:
        _remove_orphans(self.root)
        # the owner's pid in the name: a scratch directory whose process is gone (kill -9) is an orphan
        self.scratch = Path(tempfile.mkdtemp(prefix=f".{self.stage}-{os.getpid()}-", dir=self.root))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    def commit(self, files: list[str], record: Callable[[Artifact], None]) -> Artifact:
        """Move `files` (paths relative to the scratch and to the artifact alike) into place, in order,
        then call `record(artifact)` on the manifest as it is now and save it, all under the lock.

        List a graph after its weights: a crash between two moves (or a `record` that raises) leaves
        the manifest pointing at files that fail verification, so readers refuse them (never
        silently wrong), and the same stage run again repairs it: it loads the artifact with its own
        outputs in `Artifact.load(..., replacing=...)`. `record` must not load the artifact with
        verification: that waits for a shared lock this process already holds exclusively.
        """
        with locked(self.root):
            artifact = Artifact.load(self.root, verify=False)
            for rel in files:
                target = artifact.path(rel)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.scratch / rel, target)
                fsync_dir(target.parent)
            for rel in files:
                artifact.add_file(rel)
            record(artifact)
            artifact.save()
        return artifact


def _remove_orphans(root: Path) -> None:
    """Remove the scratch directories of stages whose process no longer runs (killed before their cleanup).

    A scratch directory is `.<stage>-<pid>-<random>`; one of a live process (another stage working on this
    version right now) is left alone. Names without a pid (written before pids were recorded) are orphans.
    """
    for path in root.glob(".*-*"):
        stage, _, rest = path.name[1:].partition("-")
        if not path.is_dir() or not stage.isalpha():
            continue
        pid = rest.partition("-")[0]
        if pid.isdigit() and _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal sent: only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True
