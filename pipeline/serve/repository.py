"""The model repository: verify and load the versions found on disk, pick their variants, hot reload.

Which directories hold versions is `scan.find_versions`; which variant file a version serves is
`variant_choice.choose`. Every load verifies the artifact's hashes (`Artifact.load`). A version
that fails (bad manifest, tampered or truncated file, symlinked out of place, not loadable by
onnxruntime) is refused with a one-line reason in the log, readiness and metadata, and never
replaces what is being served; the versions beside it keep serving.

Hot reload: a poller rescans the paths, loads new version directories in a worker thread and swaps
them in (with `latest=N`, the newest N versions that load are served). It also re-reads the manifest
of every served version whose manifest file changed: when the variant to serve changed (a new or
re-made variant, e.g. `--variant int8` was falling back to fp32 and int8 now passed), the new
session is loaded and swapped in; when the changed manifest is refused, the version keeps serving
what it had, and the refusal is logged once and shown in its status and metadata.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.artifact.directory import Artifact, locked
from pipeline.artifact.labels import read_labels
from pipeline.core.errors import ArtifactError, InputError, PipelineError
from pipeline.serve import scan
from pipeline.serve.batching import Batcher, BatchSettings
from pipeline.serve.errors import NotFound, RequestError
from pipeline.serve.generation.served import TextGenerator
from pipeline.serve.generation.settings import GenerationSettings
from pipeline.serve.metrics import Metrics
from pipeline.serve.served_version import (
    VERSION_DIGITS,
    Answers,
    LoadedVersion,
    Stamp,
    manifest_stamp,
    version_number,
)
from pipeline.serve.session import ModelSession, SessionOptions
from pipeline.serve.variant_choice import Choice, NotExported, VariantRefused, choose
from pipeline.serve.version_policy import HeldBack, admit, default_version, held_by_labels

log = logging.getLogger("pipe.serve")

LOAD_ERRORS = (ArtifactError, InputError, OSError)  # OSError: unreadable files


@dataclass(frozen=True)
class RepositorySettings:
    """What to serve from which paths."""

    paths: tuple[Path, ...]
    latest: int | None = None  # serve the newest N loadable versions of each model; None: all
    variants: dict[str, str] = field(default_factory=dict)  # model -> variant; key "*" for every model
    poll_s: float = 2.0  # seconds between scans for new, removed or changed versions; 0 turns hot reload off
    policy: str = "all"  # which versions may be served: all, checked or promoted (version_policy.py)


def _read_every_label_file(versions: dict[str, dict[int, Path]]) -> dict[str, dict[str, int] | ArtifactError]:
    """Model -> its labels, or why its labels file was refused: one model's bad file never stops the
    scan of the others (run in a worker thread)."""
    read: dict[str, dict[str, int] | ArtifactError] = {}
    for name, found in versions.items():
        model_root = next(iter(found.values())).parent
        try:
            read[name] = read_labels(model_root)
        except ArtifactError as exc:
            read[name] = exc
    return read


class Repository:
    """The models being served, keyed by name and version, plus the versions that failed."""

    def __init__(
        self,
        settings: RepositorySettings,
        session_options: SessionOptions,
        batch_settings: BatchSettings,
        metrics: Metrics,
        executor: Executor,
        generation: GenerationSettings | None = None,
    ) -> None:
        self.settings = settings
        self._generation = generation or GenerationSettings()
        self._session_options = session_options
        self._batch_settings = batch_settings
        self._metrics = metrics
        self._executor = executor
        self.models: dict[str, dict[int, LoadedVersion]] = {}
        self.failed: dict[tuple[str, int], tuple[Stamp, str]] = {}  # -> (manifest stamp, one-line error)
        self.strays: dict[Path, str] = {}  # directories holding a manifest that are not versions -> why
        self.labels: dict[str, dict[str, int]] = {}  # model -> its labels (labels.json) -> version
        self.held: dict[tuple[str, int], str] = {}  # versions found that the policy does not serve -> why
        self.label_errors: dict[str, str] = {}  # model -> why its labels file was refused (logged once)
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
        await asyncio.gather(*(v.close() for versions in self.models.values() for v in versions.values()))

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
        """Load new versions, reload changed ones, drop removed ones; a refused load never replaces a served one."""
        async with self._lock:
            found = await asyncio.to_thread(scan.find_versions, self.settings.paths)
            self._report_strays(found.strays)
            # every labels file read in a worker thread: a file on a slow disk never holds the event loop
            read = await asyncio.to_thread(_read_every_label_file, found.versions)
            served: dict[str, dict[int, LoadedVersion]] = {}
            held: dict[tuple[str, int], str] = {}
            for name, versions in sorted(found.versions.items()):
                current = self.models.get(name, {})
                labels = self._take_labels(name, read[name])
                keep: dict[int, LoadedVersion] = {}
                for version in sorted(versions, reverse=True):
                    if self.settings.latest is not None and len(keep) >= self.settings.latest:
                        break
                    if (why := held_by_labels(self.settings.policy, version, labels)) is not None:
                        if (name, version) not in self.held:
                            log.info("not serving %s v%d: %s", name, version, why)
                        held[(name, version)] = why
                        continue
                    if version in current:
                        loaded = await self._recheck(current[version])
                    else:
                        loaded = await self._try_load(name, version, versions[version])
                    if loaded is not None:
                        keep[version] = loaded
                if keep:
                    served[name] = dict(sorted(keep.items()))
            kept = {id(v) for vs in served.values() for v in vs.values()}
            dropped = [v for vs in self.models.values() for v in vs.values() if id(v) not in kept]
            self.models = served
            self.held = held
            self.labels = {name: self.labels[name] for name in found.versions if name in self.labels}
            self.label_errors = {name: e for name, e in self.label_errors.items() if name in found.versions}
            self.failed = {k: f for k, f in self.failed.items() if k[1] in found.versions.get(k[0], {})}
            for old in dropped:  # unloaded, or replaced by a reload: answer what it accepted, then stop
                if old.version not in served.get(old.name, {}):
                    log.info("unloaded %s v%d", old.name, old.version)
                    self._metrics.loaded(old.name, "unloaded")
                await old.close()

    def _take_labels(self, name: str, read: dict[str, int] | ArtifactError) -> dict[str, int]:
        """The model's labels as read; a refused labels file keeps the labels read before (logged once, and
        shown in the model's readiness and metadata until it is fixed)."""
        if isinstance(read, ArtifactError):
            if self.label_errors.get(name) != str(read):
                log.error("kept the labels of %s as they were: %s", name, read)
            self.label_errors[name] = str(read)
            return self.labels.get(name, {})
        if self.label_errors.pop(name, None) is not None:
            log.info("the labels file of %s is readable again", name)
        if read != self.labels.get(name, {}):
            log.info("labels of %s: %s", name, read or "none")
        self.labels[name] = read
        return read

    def _report_strays(self, strays: dict[Path, str]) -> None:
        for path, reason in strays.items():
            if path not in self.strays:
                log.error("refused %s: %s", path, reason)
        self.strays = strays

    async def _try_load(self, name: str, version: int, root: Path) -> LoadedVersion | None:
        try:
            stamp = manifest_stamp(root)  # before reading: a change made during the load is seen by the next scan
        except OSError:  # removed since the scan: the next scan no longer finds it
            return None
        if (previous := self.failed.get((name, version))) and previous[0] == stamp:
            return None  # failed before and unchanged since: do not retry every tick
        try:
            choice, session, answers = await asyncio.to_thread(self._open, root, None)
        except LOAD_ERRORS as exc:
            self._refuse(name, version, root, stamp, exc)
            return None
        assert session is not None  # no current choice: a session is always made
        self.failed.pop((name, version), None)
        loaded = self._serve(name, version, root, choice, session, stamp)
        loaded.read(answers)
        self._metrics.loaded(name, "loaded")
        log.info(
            "loaded %s v%d from %s (variant %s, %s) on %s; inputs %s; batching %s",
            name, version, root, choice.variant, choice.file, session.providers,
            ", ".join(s.describe() for s in session.inputs),
            f"up to {self._batch_settings.max_batch_size} rows" if session.batchable else session.batch_off,
        )  # fmt: skip
        return loaded

    def _refuse(self, name: str, version: int, root: Path, stamp: Stamp, exc: BaseException) -> None:
        self.failed[(name, version)] = (stamp, scan.one_line(exc))
        if isinstance(exc, (NotExported, HeldBack)):  # work in progress (not exported, not checked): no fault
            log.warning("not serving %s v%d yet: %s", name, version, scan.one_line(exc))
            return
        self._metrics.loaded(name, "refused")
        log.error("refused %s v%d from %s: %s", name, version, root, scan.one_line(exc))

    async def _recheck(self, loaded: LoadedVersion) -> LoadedVersion | None:
        """A served version whose manifest changed: swap in the variant it should now serve, if that changed.

        A manifest that no longer loads (malformed, tampered) or a new variant onnxruntime cannot
        load never replaces what is served. A sound manifest that says the chosen variant cannot be
        served (it failed, or is gone) refuses the version, as it would at startup: None.
        """
        try:
            stamp = manifest_stamp(loaded.root)
        except OSError:  # removed while scanning: the next scan no longer finds it and unloads it
            return loaded
        if stamp == loaded.stamp:
            return loaded
        loaded.stamp = stamp  # each change is read once, so a refusal is logged once
        try:
            choice, session, answers = await asyncio.to_thread(self._open, loaded.root, loaded.choice)
            if session is None:  # the same file as served
                loaded.read(answers)  # the manifest may record the preprocessing anew
                if loaded.reload_error is not None:
                    log.info("%s v%d: its manifest is valid again", loaded.name, loaded.version)
                loaded.reload_error = None
                return loaded
        except (VariantRefused, HeldBack) as exc:  # e.g. a check run again that failed: no longer served
            self._refuse(loaded.name, loaded.version, loaded.root, stamp, exc)
            return None
        except LOAD_ERRORS as exc:
            loaded.reload_error = scan.one_line(exc)
            log.error(
                "kept serving %s v%d (variant %s, %s): its changed manifest was refused: %s",
                loaded.name, loaded.version, loaded.variant, loaded.file, loaded.reload_error,
            )  # fmt: skip
            return loaded
        log.info(
            "reloaded %s v%d from %s: variant %s (%s) replaces %s (%s) on %s",
            loaded.name, loaded.version, loaded.root, choice.variant, choice.file,
            loaded.variant, loaded.file, session.providers,
        )  # fmt: skip
        reloaded = self._serve(loaded.name, loaded.version, loaded.root, choice, session, stamp)
        reloaded.read(answers)
        self._metrics.loaded(loaded.name, "reloaded")
        return reloaded

    def _open(self, root: Path, current: Choice | None) -> tuple[Choice, ModelSession | None, Answers]:
        """Verify the artifact, choose its variant and, unless that is `current`, create its session; and
        read what its manifest says about answering (how its image inputs take pictures, its detector).

        All under the artifact's shared lock (worker thread): a stage committing a new file in
        between would otherwise have onnxruntime read a file nobody verified.
        """
        with locked(root, shared=True):
            artifact = Artifact.load(root, verify=True)
            admit(self.settings.policy, artifact)
            choice = choose(artifact, self.settings.variants)
            answers = Answers.of(artifact.manifest, root)
            if choice == current:
                return choice, None, answers
            session = ModelSession(artifact.path(choice.file), self._session_options, artifact.manifest)
            session.generator = TextGenerator.prepare(root, artifact.manifest, session.session)  # text-generation
            return choice, session, answers

    def _serve(
        self, name: str, version: int, root: Path, choice: Choice, session: ModelSession, stamp: Stamp
    ) -> LoadedVersion:
        stats = self._metrics.model(name, version)
        batcher = Batcher(
            session.run, session.batchable, self._batch_settings, self._executor, stats, padding=session.padding
        )
        loaded = LoadedVersion(name, version, root, choice, session, batcher, stamp)
        if session.generator is not None:  # made with the session, in the worker thread (tokenizer, template)
            stats = self._metrics.generation(name, version)
            loaded.generator = session.generator(self._generation, self._executor, stats)
            log.info("%s v%d generates: %s", name, version, loaded.generator.engine.describe())
        return loaded

    def get(self, name: str, version: str | None, label: str | None = None) -> LoadedVersion:
        """The version asked for (by number or label), or the default one (the `stable` label's, else the
        newest); 404 naming what exists."""
        versions = self.models.get(name)
        if not versions:
            reason = self._failure_note(name)
            raise NotFound(f"unknown model {name!r}{reason}; served models: {sorted(self.models)}")
        labels = self.labels.get(name, {})
        if label is not None:
            if label not in labels:
                raise NotFound(f"model {name!r} has no label {label[:70]!r}; its labels: {labels or 'none'}")
            version = str(labels[label])
        if version is None:
            default, why = default_version(list(versions), labels)
            if default is None:
                raise NotFound(
                    f"model {name!r}: {why}{self._failure_note(name, labels.get('stable'))}; name a version "
                    f"(served: {sorted(versions)}) or `pipe promote` a served one"
                )
            return versions[default]
        number = version_number(version)
        if number is None:
            raise RequestError(
                f"model version must be a positive integer of at most {VERSION_DIGITS} ASCII digits, "
                f"got {version[:40]!r}"
            )
        loaded = versions.get(number)
        if loaded is None:
            reason = self._failure_note(name, number)
            raise NotFound(f"model {name!r} has no version {number} being served{reason}; served: {sorted(versions)}")
        return loaded

    def get_all(self, name: str) -> dict[int, LoadedVersion]:
        """Every served version of a model; 404 naming what exists."""
        self.get(name, None)
        return self.models[name]

    def names(self) -> set[str]:
        """Every model found: served, or with refused versions only."""
        return set(self.models) | {name for name, _ in [*self.failed, *self.held]}

    def _failure_note(self, name: str, version: int | None = None) -> str:
        errors = [e for (n, v), (_, e) in self.failed.items() if n == name and version in (None, v)]
        return f" (it failed to load: {errors[-1]})" if errors else ""

    def states(self, name: str) -> dict[int, tuple[bool, str]]:
        """Every known version of a model -> (served?, message): a refused version's load error, or why a
        served version's changed manifest was refused ('' when there is nothing to say)."""
        states = {v: (False, e) for (n, v), (_, e) in self.failed.items() if n == name}
        states.update({v: (False, why) for (n, v), why in self.held.items() if n == name})
        states.update({v: (True, loaded.reload_error or "") for v, loaded in self.models.get(name, {}).items()})
        if not states:
            raise NotFound(f"unknown model {name!r}; served models: {sorted(self.models)}")
        return states

    def ready_map(self) -> dict[tuple[str, int], bool]:
        ready = {key: False for key in [*self.failed, *self.held]}
        ready.update({(n, v): True for n, vs in self.models.items() for v in vs})
        return ready
