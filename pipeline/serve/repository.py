"""The model repository: find artifacts, verify and load them, pick versions and variants, hot reload.

Accepted paths (any mix): a repository `artifacts/` holding `<name>/<version>/`, one model
`artifacts/<name>`, or one artifact `artifacts/<name>/<version>`. Names and versions come from
the directories, as in Triton, and must agree with each manifest.

Every load verifies the artifact's hashes (`Artifact.load`). A version that fails (tampered,
truncated, not loadable by onnxruntime) is reported in logs, readiness and metadata, and never
replaces what is being served. A poller notices new version directories, loads them in a worker
thread and swaps them in; with `latest=N`, the newest N versions that load are served.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from pipeline.artifact import MANIFEST_NAME, Artifact
from pipeline.errors import ArtifactError, InputError, PipelineError
from pipeline.serve.batching import Batcher, BatchSettings
from pipeline.serve.errors import NotFound, RequestError
from pipeline.serve.metrics import Metrics
from pipeline.serve.protocols.base import ModelIO
from pipeline.serve.session import ModelSession, SessionOptions

log = logging.getLogger("pipe.serve")

FP32 = "fp32"  # the variant name meaning model.onnx itself


@dataclass(frozen=True)
class RepositorySettings:
    """What to serve from which paths."""

    paths: tuple[Path, ...]
    latest: int | None = None  # serve the newest N loadable versions of each model; None: all
    variants: dict[str, str] = field(default_factory=dict)  # model -> variant; key "*" for every model
    poll_s: float = 2.0  # seconds between scans for new or removed versions; 0 turns hot reload off


@dataclass
class LoadedVersion:
    """A verified artifact version with its session and batcher, ready for requests."""

    name: str
    version: int
    root: Path
    variant: str
    file: str
    session: ModelSession
    batcher: Batcher

    @cached_property
    def io(self) -> ModelIO:
        """Name, version and tensor specs: what the protocols see of this version."""
        return ModelIO(self.name, self.version, self.session.inputs, self.session.outputs)


def find_versions(paths: tuple[Path, ...]) -> dict[str, dict[int, Path]]:
    """Map model name -> version -> directory for every version directory holding a manifest."""
    found: dict[str, dict[int, Path]] = {}
    for path in paths:
        if (path / MANIFEST_NAME).is_file():
            roots = [(path.parent.name, path)]
        elif _version_dirs(path):
            roots = [(path.name, d) for d in _version_dirs(path)]
        else:
            roots = [(m.name, d) for m in sorted(path.iterdir()) if m.is_dir() for d in _version_dirs(m)]
        for name, directory in roots:
            if not directory.name.isdigit():
                raise InputError(f"{directory}: a served artifact must live in a numbered version directory <name>/<N>")
            found.setdefault(name, {})[int(directory.name)] = directory
    return found


def _version_dirs(model_root: Path) -> list[Path]:
    if not model_root.is_dir():
        return []
    return sorted(p for p in model_root.iterdir() if p.name.isdigit() and (p / MANIFEST_NAME).is_file())


def check_paths(paths: tuple[Path, ...]) -> None:
    """Refuse paths that do not exist before the server starts (exit 2 from the CLI)."""
    for path in paths:
        if not path.is_dir():
            raise InputError(f"{path} is not a directory; pass a repository (artifacts/), a model or an artifact")


class Repository:
    """The models being served, keyed by name and version, plus the versions that failed."""

    def __init__(
        self,
        settings: RepositorySettings,
        session_options: SessionOptions,
        batch_settings: BatchSettings,
        metrics: Metrics,
        executor: Executor,
    ) -> None:
        self.settings = settings
        self._session_options = session_options
        self._batch_settings = batch_settings
        self._metrics = metrics
        self._executor = executor
        self.models: dict[str, dict[int, LoadedVersion]] = {}
        self.failed: dict[tuple[str, int], tuple[int, str]] = {}  # -> (manifest mtime_ns, error)
        self._watcher: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        await self.refresh()
        if self.settings.poll_s > 0:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        """Stop watching, then let every batcher finish what it accepted."""
        if self._watcher:
            self._watcher.cancel()
        await asyncio.gather(*(v.batcher.close() for versions in self.models.values() for v in versions.values()))

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.poll_s)
            try:
                await self.refresh()
            except (OSError, PipelineError) as exc:  # e.g. a directory vanished mid-scan: try again next tick
                log.warning("repository scan failed: %s", exc)
            except Exception:  # a bug must not end hot reload silently: log it and keep watching
                log.exception("repository scan failed")

    async def refresh(self) -> None:
        """Load new versions, drop removed ones, keep serving the old when a new one fails."""
        async with self._lock:
            on_disk = await asyncio.to_thread(find_versions, self.settings.paths)
            served: dict[str, dict[int, LoadedVersion]] = {}
            for name, versions in sorted(on_disk.items()):
                current = self.models.get(name, {})
                keep: dict[int, LoadedVersion] = {}
                for version in sorted(versions, reverse=True):
                    if self.settings.latest is not None and len(keep) >= self.settings.latest:
                        break
                    if version in current:
                        keep[version] = current[version]
                    elif (loaded := await self._try_load(name, version, versions[version])) is not None:
                        keep[version] = loaded
                if keep:
                    served[name] = dict(sorted(keep.items()))
            retired = [v for name, vs in self.models.items() for n, v in vs.items() if n not in served.get(name, {})]
            self.models = served
            self.failed = {k: f for k, f in self.failed.items() if k[1] in on_disk.get(k[0], {})}
            for gone in retired:
                log.info("unloaded %s v%d", gone.name, gone.version)
                await gone.batcher.close()

    async def _try_load(self, name: str, version: int, root: Path) -> LoadedVersion | None:
        stamp = (root / MANIFEST_NAME).stat().st_mtime_ns
        if (previous := self.failed.get((name, version))) and previous[0] == stamp:
            return None  # failed before and unchanged since: do not retry every tick
        try:
            artifact, variant, file, session = await asyncio.to_thread(self._load, name, version, root)
        except (ArtifactError, InputError, OSError) as exc:  # OSError: unreadable files
            self.failed[(name, version)] = (stamp, str(exc))
            log.error("refused %s v%d from %s: %s", name, version, root, exc)
            return None
        self.failed.pop((name, version), None)
        stats = self._metrics.model(name, version)
        batcher = Batcher(session.run, session.batchable, self._batch_settings, self._executor, stats)
        log.info(
            "loaded %s v%d from %s (variant %s, %s) on %s; inputs %s; batching %s",
            name, version, root, variant, file, session.providers,
            ", ".join(s.describe() for s in session.inputs),
            f"up to {self._batch_settings.max_batch_size} rows" if session.batchable else "off (fixed batch dim)",
        )  # fmt: skip
        return LoadedVersion(name, version, artifact.root, variant, file, session, batcher)

    def _load(self, name: str, version: int, root: Path) -> tuple[Artifact, str, str, ModelSession]:
        """Verify the artifact and create its session (runs in a worker thread)."""
        artifact = Artifact.load(root, verify=True)
        if (artifact.name, artifact.version) != (name, version):
            raise ArtifactError(
                f"{root}: the manifest says {artifact.name} v{artifact.version} but the directory is {name}/{version}; "
                "move the artifact to <name>/<version> matching its manifest"
            )
        variant, file = self._variant_file(artifact)
        return artifact, variant, file, ModelSession(artifact.path(file), self._session_options)

    def _variant_file(self, artifact: Artifact) -> tuple[str, str]:
        explicit = self.settings.variants.get(artifact.name)
        wanted = explicit or self.settings.variants.get("*", FP32)
        available = [FP32, *(k for k, v in artifact.manifest.variants.items() if v.format == "onnx")]
        if wanted == FP32:
            file = "model.onnx"
        elif wanted in artifact.manifest.variants and artifact.manifest.variants[wanted].format == "onnx":
            file = artifact.manifest.variants[wanted].file
        elif explicit:
            raise ArtifactError(f"{artifact.root}: variant {wanted!r} does not exist; available: {available}")
        else:  # a server-wide default this model lacks: serve its fp32 model, and say so
            log.warning("%s has no variant %r (available %s); serving fp32", artifact.root, wanted, available)
            wanted, file = FP32, "model.onnx"
        if file not in artifact.manifest.files:
            raise ArtifactError(
                f"{artifact.root}: {file} is not listed in the manifest's files, so it cannot be verified; "
                "re-create the artifact with pipe export / pipe import"
            )
        return wanted, file

    def get(self, name: str, version: str | None) -> LoadedVersion:
        """The version asked for, or the newest served one; 404 naming what exists."""
        versions = self.models.get(name)
        if not versions:
            reason = self._failure_note(name)
            raise NotFound(f"unknown model {name!r}{reason}; served models: {sorted(self.models)}")
        if version is None:
            return versions[max(versions)]
        if not version.isdigit():
            raise RequestError(f"model version must be a positive integer, got {version!r}")
        loaded = versions.get(int(version))
        if loaded is None:
            reason = self._failure_note(name, int(version))
            raise NotFound(f"model {name!r} has no version {version} being served{reason}; served: {sorted(versions)}")
        return loaded

    def _failure_note(self, name: str, version: int | None = None) -> str:
        errors = [e for (n, v), (_, e) in self.failed.items() if n == name and version in (None, v)]
        return f" (it failed to load: {errors[-1]})" if errors else ""

    def states(self, name: str) -> dict[int, str | None]:
        """Every known version of a model -> None when served, else its load error."""
        states: dict[int, str | None] = {v: e for (n, v), (_, e) in self.failed.items() if n == name}
        states.update({v: None for v in self.models.get(name, {})})
        if not states:
            raise NotFound(f"unknown model {name!r}; served models: {sorted(self.models)}")
        return states

    def ready_map(self) -> dict[tuple[str, int], bool]:
        ready = {key: False for key in self.failed}
        ready.update({(n, v): True for n, vs in self.models.items() for v in vs})
        return ready
