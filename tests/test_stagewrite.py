"""Stage writes: two stages writing to one version at once keep both records; a failed stage writes nothing."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pipeline.artifact.directory import LOCK_NAME, Artifact
from pipeline.artifact.manifest import Manifest
from pipeline.artifact.stagewrite import StageWrite
from pipeline.artifact.variants import Variant, variant_file
from tests.conftest import build_artifact

# One stage in its own process: make a file in scratch, wait until the other process is ready too,
# then commit a variant record while holding the fresh manifest for a moment (the widest race).
WRITER = """
import contextlib, sys, time
from pathlib import Path
import pipeline.artifact.stagewrite as sw
from pipeline.artifact.variants import Variant, variant_file

root, name, barrier, use_lock = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4] == "lock"
if not use_lock:
    sw.locked = lambda root, shared=False: contextlib.nullcontext()
with sw.StageWrite(root, "optimize") as write:
    rel = variant_file(name)
    (write.scratch / rel).parent.mkdir(parents=True)
    (write.scratch / rel).write_bytes(name.encode() * 100)
    (barrier / name).touch()
    while len(list(barrier.iterdir())) < 2:
        time.sleep(0.01)

    def record(artifact):
        time.sleep(0.5)  # another stage reading and saving now must not lose this record, nor this one its
        artifact.add_variant(name, Variant(file=rel, precision="int8", format="onnx", stage="optimize"))

    write.commit([rel], record)
"""


def _two_stages_at_once(root: Path, tmp_path: Path, lock: str) -> set[str]:
    barrier = tmp_path / f"barrier-{lock}"
    barrier.mkdir()
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(root), name, str(barrier), lock])
        for name in ("int8", "fp16")
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    return set(Artifact.load(root).manifest.variants)


def test_two_stages_writing_one_version_at_once_keep_both_records(toy_artifact: Artifact, tmp_path: Path) -> None:
    assert _two_stages_at_once(toy_artifact.root, tmp_path, "lock") == {"int8", "fp16"}
    loaded = Artifact.load(toy_artifact.root)  # both files are listed with their hashes
    assert {variant_file("int8"), variant_file("fp16")} <= set(loaded.manifest.files)
    assert not [p for p in toy_artifact.root.iterdir() if p.name.startswith(".optimize-")]  # scratch removed


def test_without_the_lock_one_record_is_lost(tmp_path: Path) -> None:
    """The race the lock prevents is real: the same two writers without it lose a record."""
    root = build_artifact(tmp_path / "artifacts" / "toy" / "1").root
    assert len(_two_stages_at_once(root, tmp_path, "nolock")) == 1


def test_a_stage_failing_before_commit_leaves_the_artifact_as_it_was(toy_artifact: Artifact) -> None:
    before = (toy_artifact.root / "manifest.json").read_bytes()
    names = sorted(p.name for p in toy_artifact.root.iterdir())
    with pytest.raises(RuntimeError, match="gate failed"), StageWrite(toy_artifact.root, "optimize") as write:
        (write.scratch / "model.onnx").write_bytes(b"a worse model")
        raise RuntimeError("gate failed")
    assert (toy_artifact.root / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in toy_artifact.root.iterdir()) == names  # no scratch left, model.onnx untouched
    assert Artifact.load(toy_artifact.root).manifest.variants == {}


def test_commit_records_on_the_manifest_as_it_is_now(toy_artifact: Artifact) -> None:
    with StageWrite(toy_artifact.root, "optimize") as write:
        rel = variant_file("opt")
        (write.scratch / "variants").mkdir()
        (write.scratch / rel).write_bytes(b"optimized")
        # Meanwhile another stage saved a change: commit must build on it, not on an older copy.
        other = Artifact.load(toy_artifact.root)
        other.manifest.metrics["f1"] = 0.5
        other.save()
        write.commit(
            [rel], lambda a: a.add_variant("opt", Variant(file=rel, precision="fp32", format="onnx", stage="optimize"))
        )
    loaded = Artifact.load(toy_artifact.root).manifest
    assert loaded.metrics["f1"] == 0.5 and loaded.variants["opt"].size == len(b"optimized")


def _commit_a_new_model(root: Path) -> None:
    with StageWrite(root, "export") as write:
        (write.scratch / "model.onnx").write_bytes(b"a re-exported model")
        write.commit(["model.onnx"], lambda artifact: None)


@pytest.mark.parametrize("lock_file", [True, False], ids=["lock-file", "no-lock-file-yet"])
def test_a_reader_never_pairs_a_manifest_with_files_of_another_commit(
    toy_artifact: Artifact, monkeypatch: pytest.MonkeyPatch, lock_file: bool
) -> None:
    """A stage committing while `Artifact.load` verifies waits for it, instead of making it say "tampered"."""
    root = toy_artifact.root
    if lock_file:
        (root / LOCK_NAME).touch()
    parse = Manifest.from_dict
    writers: list[threading.Thread] = []

    def commit_while_reading(data: object, source: str = "manifest.json") -> Manifest:
        if not writers:  # the reader has the manifest's bytes: a stage commits now, unless the lock holds it off
            writers.append(threading.Thread(target=_commit_a_new_model, args=(root,)))
            writers[0].start()
            writers[0].join(timeout=1)
        return parse(data, source)

    monkeypatch.setattr(Manifest, "from_dict", commit_while_reading)
    before = Artifact.load(root)  # consistent: the old manifest with the old files
    writers[0].join(timeout=30)
    assert not writers[0].is_alive()
    after = Artifact.load(root)  # consistent: the new manifest with the new file
    assert before.manifest.files["model.onnx"] != after.manifest.files["model.onnx"]


def test_the_scratch_of_a_killed_stage_is_removed_by_the_next_and_a_live_ones_kept(toy_artifact: Artifact) -> None:
    root = toy_artifact.root
    holder = (
        "import sys, time\nfrom pipeline.artifact.stagewrite import StageWrite\n"
        "with StageWrite(sys.argv[1], 'optimize') as w:\n    print(w.scratch, flush=True)\n    time.sleep(60)\n"
    )
    killed = subprocess.Popen([sys.executable, "-c", holder, str(root)], stdout=subprocess.PIPE, text=True)
    orphan = Path(killed.stdout.readline().strip())
    killed.kill()  # kill -9: no __exit__, the scratch stays behind
    killed.wait()
    live = subprocess.Popen([sys.executable, "-c", holder, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        running = Path(live.stdout.readline().strip())
        assert not orphan.exists() and running.is_dir()  # the next stage to start removed the killed one's
        (root / ".edge-x9k2").mkdir()  # a scratch left before pids were in the names
        with StageWrite(root, "edge") as write:
            assert write.scratch.is_dir() and not (root / ".edge-x9k2").exists()
            assert running.is_dir()  # another stage at work on this version right now
    finally:
        live.kill()
        live.wait()
        live.stdout.close()
        killed.stdout.close()
