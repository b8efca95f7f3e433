"""Human-readable views of an artifact for the terminal."""

from __future__ import annotations

from pipeline.artifact import Artifact
from pipeline.manifest import TensorSpec


def _shape(spec: TensorSpec) -> str:
    return "[" + ", ".join(str(d) for d in spec.shape) + "]"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def manifest_table(artifact: Artifact) -> str:
    """A compact summary of the manifest: identity, I/O, metrics, files and variants."""
    m = artifact.manifest
    lines = [
        f"{m.name} v{m.version}  ({m.task}, created {m.created})",
        f"  path      {artifact.root}",
        f"  backend   {m.lineage.backend or '-'}   seed {_or_dash(m.lineage.seed)}   pipe {m.lineage.code_version}",
    ]
    if m.labels:
        shown = ", ".join(m.labels[:10]) + (" ..." if len(m.labels) > 10 else "")
        lines.append(f"  labels    {len(m.labels)}: {shown}")
    for kind, specs in (("input", m.inputs), ("output", m.outputs)):
        for spec in specs:
            lines.append(f"  {kind:<9} {spec.name}: {spec.dtype} {_shape(spec)} {spec.layout}")
    if m.metrics:
        lines.append("  metrics   " + "  ".join(f"{k}={v:.4g}" for k, v in sorted(m.metrics.items())))
    if m.files:
        lines.append("  files")
        width = max(len(rel) for rel in m.files)
        for rel, entry in sorted(m.files.items()):
            lines.append(f"    {rel:<{width}}  {_size(entry.size):>10}  sha256 {entry.sha256[:12]}")
    if m.variants:
        lines.append("  variants")
        for name, v in sorted(m.variants.items()):
            metrics = "  ".join(f"{k}={val:.4g}" for k, val in sorted(v.metrics.items()))
            status = v.status if v.passed else f"FAILED ({v.reason})"
            lines.append(f"    {name:<12} {v.format}/{v.precision:<5} {v.file}  {status}  {metrics}".rstrip())
    if names := m.stages.names():
        lines.append("  stages    " + ", ".join(names))
    return "\n".join(lines)
