"""A check run for people and CI: a terminal table, JUnit XML (one testcase per check), Markdown, JSON."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from pipeline.check.verdict import CheckRun
from pipeline.core.fsutil import write_user_file
from pipeline.core.jsontypes import encode

SUITE = "pipe check"
MARK = {"passed": "✅ passed", "failed": "❌ failed", "skipped": "➖ skipped"}
# Characters XML 1.0 cannot hold, even escaped (control characters, lone surrogates, U+FFFE/U+FFFF):
# a parser rejects the whole file, so they are written as Python escapes (`\x07`) instead.
NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def to_json(run: CheckRun) -> str:
    failed = len(run.failures)
    return json.dumps(
        {
            "candidate": {
                "name": run.candidate.name,
                "version": run.candidate.version,
                "path": run.sides.get("candidate"),
            },
            "baseline": {"name": run.baseline.name, "version": run.baseline.version, "path": run.sides.get("baseline")},
            "recipe_changes": run.recipe_changes,
            "budgets": _finite(run.budgets.model_dump()),
            "passed": failed == 0,
            "failures": failed,
            "checks": [_finite(encode(r)) for r in run.results],
            "notes": run.notes,
        },
        indent=2,
        allow_nan=False,
    )


def to_junit(run: CheckRun) -> str:
    """JUnit XML as CI systems read it: a testsuite of one testcase per check, a failure carrying the message."""
    skipped = sum(r.status == "skipped" for r in run.results)
    suite = ET.Element(
        "testsuite",
        name=SUITE, tests=str(len(run.results)), failures=str(len(run.failures)), errors="0", skipped=str(skipped),
    )  # fmt: skip
    for result in run.results:
        name, detail = _xml(result.name), _xml(result.detail)
        case = ET.SubElement(suite, "testcase", classname=_xml(f"pipe.check.{run.candidate.name}"), name=name)
        if result.status == "failed":
            ET.SubElement(case, "failure", message=detail, type="regression").text = detail
        elif result.status == "skipped":
            ET.SubElement(case, "skipped", message=detail)
        else:
            ET.SubElement(case, "system-out").text = detail
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def to_markdown(run: CheckRun) -> str:
    """A CI step summary: the verdict, then a table of check, status and figures."""
    c, b, failed = run.candidate, run.baseline, len(run.failures)
    verdict = f"**{failed} regression(s)**" if failed else "**all checks hold**"
    lines = [
        f"### pipe check: {_cell(c.name)} v{c.version} against {_cell(b.name)} v{b.version}: {verdict}",
        "",
        f"- candidate: {_cell(run.side('candidate'))}",
        f"- baseline: {_cell(run.side('baseline'))}",
    ]
    if run.recipe_changes:
        lines.append(f"- recipe changes (baseline -> candidate): {_cell('; '.join(run.recipe_changes))}")
    lines += ["", "| check | status | figures |", "| --- | --- | --- |"]
    lines += [f"| {_code(_pipes(r.name))} | {MARK[r.status]} | {_cell(r.detail)} |" for r in run.results]
    lines += [f"\n> note: {_cell(n)}" for n in run.notes]
    return "\n".join(lines) + "\n"


def to_table(run: CheckRun) -> str:
    """The sides by path and version, the recipe keys that differ, then one line per check."""
    lines = [f"candidate  {run.side('candidate')}", f"baseline   {run.side('baseline')}"]
    if run.recipe_changes:
        lines.append("recipe     " + "; ".join(run.recipe_changes) + "  (baseline -> candidate)")
    width = max(len(r.name) for r in run.results)
    return "\n".join([*lines, *(f"  {r.name:<{width}}  {r.status:<7}  {r.detail}" for r in run.results)])


def write_reports(run: CheckRun, junit: Path | None, markdown: Path | None, json_file: Path | None) -> list[Path]:
    """Write each report asked for; the paths written. One that cannot be written is InputError naming its flag."""
    written = []
    for flag, path, render in (("--junit", junit, to_junit), ("--markdown", markdown, to_markdown),
                               ("--json", json_file, to_json)):  # fmt: skip
        if path is not None:
            write_user_file(path, render(run).encode(), flag)
            written.append(path)
    return written


def _cell(text: str) -> str:
    """Text for a Markdown table cell that renders as text: HTML escaped (a label `<img onerror=...>` reaches
    $GITHUB_STEP_SUMMARY), pipes escaped, line breaks folded."""
    return _pipes(text.replace("&", "&amp;").replace("<", "&lt;"))  # no tag can open; "->" stays as written


def _pipes(text: str) -> str:
    """Pipes escaped and line breaks folded, so the text stays in its table cell (a code span needs no more)."""
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """`text` as a Markdown code span, fenced by one more backtick than the longest run inside it."""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _xml(text: str) -> str:
    return NOT_XML.sub(lambda m: ascii(m.group())[1:-1], text)


def _finite(data: Any) -> Any:
    """JSON without NaN or Infinity, which strict parsers (jq, JavaScript) refuse: a figure past any float is null."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_finite(v) for v in data]
    return data
