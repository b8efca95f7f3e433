"""A check run for people and CI: a terminal table, JUnit XML (one testcase per check), Markdown, JSON."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from pipeline.check.run import CheckRun
from pipeline.fsutil import atomic_write_bytes
from pipeline.jsontypes import encode

SUITE = "pipe check"
MARK = {"passed": "✅ passed", "failed": "❌ failed", "skipped": "➖ skipped"}


def to_json(run: CheckRun) -> str:
    failed = len(run.failures)
    return json.dumps(
        {
            "candidate": {"name": run.candidate.name, "version": run.candidate.version},
            "baseline": {"name": run.baseline.name, "version": run.baseline.version},
            "budgets": run.budgets.model_dump(),
            "passed": failed == 0,
            "failures": failed,
            "checks": [encode(r) for r in run.results],
            "notes": run.notes,
        },
        indent=2,
    )


def to_junit(run: CheckRun) -> str:
    """JUnit XML as CI systems read it: a testsuite of one testcase per check, a failure carrying the message."""
    skipped = sum(r.status == "skipped" for r in run.results)
    suite = ET.Element(
        "testsuite",
        name=SUITE, tests=str(len(run.results)), failures=str(len(run.failures)), errors="0", skipped=str(skipped),
    )  # fmt: skip
    for result in run.results:
        case = ET.SubElement(suite, "testcase", classname=f"pipe.check.{run.candidate.name}", name=result.name)
        if result.status == "failed":
            ET.SubElement(case, "failure", message=result.detail, type="regression").text = result.detail
        elif result.status == "skipped":
            ET.SubElement(case, "skipped", message=result.detail)
        else:
            ET.SubElement(case, "system-out").text = result.detail
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def to_markdown(run: CheckRun) -> str:
    """A CI step summary: the verdict, then a table of check, status and figures."""
    c, b, failed = run.candidate, run.baseline, len(run.failures)
    verdict = f"**{failed} regression(s)**" if failed else "**all checks hold**"
    lines = [
        f"### pipe check: {c.name} v{c.version} against {b.name} v{b.version}: {verdict}",
        "",
        "| check | status | figures |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{r.name}` | {MARK[r.status]} | {_cell(r.detail)} |" for r in run.results]
    lines += [f"\n> note: {_cell(n)}" for n in run.notes]
    return "\n".join(lines) + "\n"


def to_table(run: CheckRun) -> str:
    width = max(len(r.name) for r in run.results)
    return "\n".join(f"  {r.name:<{width}}  {r.status:<7}  {r.detail}" for r in run.results)


def write_reports(run: CheckRun, junit: Path | None, markdown: Path | None, json_file: Path | None) -> list[Path]:
    """Write each report asked for; the paths written."""
    written = []
    for path, render in ((junit, to_junit), (markdown, to_markdown), (json_file, to_json)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, render(run).encode())
            written.append(path)
    return written


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
