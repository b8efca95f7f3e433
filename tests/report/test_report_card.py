"""The model card's Markdown: tables that render, failed and stale variants with their reasons, the benchmark."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipeline.artifact.directory import Artifact
from pipeline.artifact.records import BenchmarkRecord, EdgeRecord
from pipeline.artifact.stagewrite import StageWrite
from pipeline.artifact.variants import Variant
from pipeline.report.card import model_card
from pipeline.report.stage import card_facts
from pipeline.report.variants import benchmark_section, edge_section
from tests.conftest import build_artifact

UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def tables(text: str) -> list[list[str]]:
    """Each run of lines starting with '|' in `text`."""
    found: list[list[str]] = []
    previous = False
    for line in text.splitlines():
        if line.startswith("|"):
            if not previous:
                found.append([])
            found[-1].append(line)
        previous = line.startswith("|")
    return found


def assert_tables_render(text: str) -> None:
    """Every table has a header rule and the same number of cells on every line (no stray pipe splits one)."""
    assert tables(text), "no table at all"
    for lines in tables(text):
        assert re.fullmatch(r"\|( --- \|)+", lines[1]), lines[:2]
        widths = {len(UNESCAPED_PIPE.findall(line)) for line in lines}
        assert len(widths) == 1, lines


def toy_with_variants(root: Path) -> Artifact:
    """The toy artifact with a failed variant (its reason holds a pipe and a line break) and a stale one."""
    artifact = build_artifact(root)
    artifact.write_file("variants/model.int8.onnx", b"int8 bytes")
    artifact.write_file("variants/model.opt.onnx", b"opt bytes")
    artifact.add_variant("int8", Variant(
        file="variants/model.int8.onnx", precision="int8", format="onnx", stage="optimize",
        parent=artifact.manifest.files["model.onnx"].sha256, status="failed",
        reason="top-1 agreement 0.91 < 0.99 | see\nreports/optimize.md", metrics={"accuracy": 0.9},
    ))  # fmt: skip
    artifact.add_variant("opt", Variant(
        file="variants/model.opt.onnx", precision="fp32", format="onnx", stage="optimize", parent="0" * 64,
        metrics={"accuracy": 0.97},
    ))  # fmt: skip
    artifact.save()
    return Artifact.load(root)


def test_failed_and_stale_variants_are_shown_with_their_reasons_in_tables_that_render(tmp_path: Path) -> None:
    artifact = toy_with_variants(tmp_path / "artifacts" / "toy" / "1")
    card = model_card(artifact, card_facts(artifact))
    assert_tables_render(card)
    int8 = next(line for line in card.splitlines() if line.startswith("| `int8` |"))
    assert "| failed: top-1 agreement 0.91 < 0.99 \\| see reports/optimize.md |" in int8
    opt = next(line for line in card.splitlines() if line.startswith("| `opt` |"))
    assert "| stale: optimize made it from a file this artifact no longer holds" in opt
    # neither is offered to serve
    assert "Servable variants: none" in card


def test_the_benchmark_is_read_by_its_keys_and_skipped_with_a_note_when_unreadable(tmp_path: Path) -> None:
    root = tmp_path / "artifacts" / "toy" / "1"
    artifact = build_artifact(root)
    assert benchmark_section(artifact)[-1].startswith("No benchmark recorded")
    rows = [
        {"name": "fp32", "runtime": "onnxruntime", "precision": "fp32", "size_bytes": 230909, "metric": 0.9889,
         "drop": 0.0, "p50_ms": 0.0113, "p95_ms": 0.0118, "throughput": 298346.3, "latency_batch": 1,
         "latency": {"1": {"p50_ms": 0.0113}}, "reason": "a | in a field the card does not show"},
        {"name": "torch", "runtime": "torch", "precision": "fp32", "size_bytes": None, "metric": 0.9889,
         "drop": None, "p50_ms": 0.0521, "latency_batch": 1, "not_timed": ""},
    ]  # fmt: skip
    report = {"model": "toy", "metric": "accuracy", "rows": rows}

    def commit(text: str) -> Artifact:
        with StageWrite(root, "benchmark") as write:
            (write.scratch / "reports").mkdir()
            (write.scratch / "reports" / "benchmark.json").write_text(text)
            (write.scratch / "reports" / "benchmark.png").write_bytes(b"\x89PNG a plot")
            return write.commit(
                ["reports/benchmark.json", "reports/benchmark.png"],
                lambda fresh: setattr(fresh.manifest.stages, "benchmark", BenchmarkRecord(formats=["fp32", "torch"])),
            )

    section = "\n".join(benchmark_section(commit(json.dumps(report))))
    assert_tables_render(section)
    assert (
        "| model | runtime | precision | size | metric | drop vs fp32 | p50 (ms) | p95 (ms) | throughput (samples/s) |"
        " not timed because |" in section
    )
    assert "| fp32 | onnxruntime | fp32 | 225.5 KiB | 0.9889 | 0 | 0.0113 | 0.0118 | 298,346 |" in section
    assert "| torch | torch | fp32 | - | 0.9889 | - | 0.0521 | - | - |" in section
    assert "metric: accuracy; latency at batch 1" in section and "![benchmark](benchmark.png)" in section

    section = "\n".join(benchmark_section(commit("{not json")))
    assert "cannot be read" in section and "run `pipe benchmark` again" in section and "|" not in section
    section = "\n".join(benchmark_section(commit(json.dumps({"rows": "none"}))))
    assert "holds no rows of figures" in section


def test_text_from_the_benchmark_report_stays_inside_its_line(tmp_path: Path) -> None:
    root = tmp_path / "artifacts" / "toy" / "1"
    build_artifact(root)
    report = {
        "metric": "accuracy\n\n# not a heading | nor a table",
        "rows": [{"name": "fp32\n# nor this", "p50_ms": 1}],
    }
    with StageWrite(root, "benchmark") as write:
        (write.scratch / "reports").mkdir()
        (write.scratch / "reports" / "benchmark.json").write_text(json.dumps(report))
        artifact = write.commit(
            ["reports/benchmark.json"],
            lambda fresh: setattr(fresh.manifest.stages, "benchmark", BenchmarkRecord(formats=["fp32"])),
        )
    section = "\n".join(benchmark_section(artifact))
    assert not [line for line in section.splitlines() if line.startswith("#") and line != "## Benchmark"], section
    assert "metric: accuracy # not a heading \\| nor a table." in section
    assert_tables_render(section)


def test_the_edge_section_names_the_host_its_times_were_measured_on(tmp_path: Path) -> None:
    artifact = build_artifact(tmp_path / "artifacts" / "toy" / "1")
    artifact.write_file("edge/model.fp32.tflite", b"tflite bytes")
    parent = artifact.manifest.files["model.onnx"].sha256
    artifact.add_variant("tflite-fp32", Variant(file="edge/model.fp32.tflite", precision="fp32", format="tflite",
                                                stage="edge", parent=parent))  # fmt: skip
    host = {"cpu": "AMD EPYC | 9454", "cpus": 2, "system": "Linux 6.8 x86_64", "python": "3.11.7"}
    artifact.manifest.stages.edge = EdgeRecord(parent=parent, converter="onnx2tf 1.28.8", variants=["tflite-fp32"],
                                               seconds={"tflite-fp32": 9.5}, host=host)  # fmt: skip
    artifact.save()
    section = "\n".join(edge_section(Artifact.load(artifact.root)))
    assert "measured on this host, not on a device: AMD EPYC \\| 9454 (2 CPUs), Linux 6.8 x86_64." in section
    assert_tables_render(section)


def test_the_benchmark_says_where_it_ran_marks_each_row_and_says_when_int8_is_slower(tmp_path: Path) -> None:
    root = tmp_path / "artifacts" / "toy" / "1"
    build_artifact(root)
    rows = [
        {"name": "fp32", "runtime": "onnxruntime", "precision": "fp32", "status": "passed", "p50_ms": 0.032,
         "latency_batch": 1},
        {"name": "int8", "runtime": "onnxruntime", "precision": "int8", "status": "passed", "p50_ms": 0.079,
         "latency_batch": 1},
        {"name": "tflite-fp16", "runtime": "litert", "precision": "fp16", "status": "failed", "p50_ms": 0.02,
         "latency_batch": 1},
    ]  # fmt: skip
    machine = {"cpu": "Intel(R) Xeon(R) Platinum 8375C", "cpu_count": 2, "platform": "Linux-6.1-x86_64",
               "onnxruntime": "1.32.0"}  # fmt: skip
    report = {"metric": "accuracy", "rows": rows, "machine": machine, "settings": {"threads": 1}}
    with StageWrite(root, "benchmark") as write:
        (write.scratch / "reports").mkdir()
        (write.scratch / "reports" / "benchmark.json").write_text(json.dumps(report))
        artifact = write.commit(
            ["reports/benchmark.json"],
            lambda fresh: setattr(fresh.manifest.stages, "benchmark", BenchmarkRecord(formats=["fp32", "int8"])),
        )
    section = "\n".join(benchmark_section(artifact))
    assert_tables_render(section)
    assert ("Timed on this machine only: Intel(R) Xeon(R) Platinum 8375C, 2 CPUs, Linux-6.1-x86_64, "
            "onnxruntime 1.32.0, 1 thread.") in section  # fmt: skip
    assert "| model | runtime | precision | status | p50 (ms) |" in section
    assert "| tflite-fp16 | litert | fp16 | failed | 0.02 |" in section
    assert ("On this machine int8 (int8) is slower than fp32 (fp32): p50 0.079 ms against 0.032 ms at batch 1. "
            "It saves size here, not time; serve fp32 unless the size matters.") in section  # fmt: skip
