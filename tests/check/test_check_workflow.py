"""The example workflow (.github/workflows/model-regression.yml) against the real CLI, so it cannot rot."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import yaml

from pipeline.cli import main

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "model-regression.yml"


def pipe_commands(script: str) -> list[list[str]]:
    """Every `pipe ...` command line of a shell script, continuations joined, split as the shell would."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words and Path(words[0]).name == "pipe":
            commands.append(words[1:])
    return commands


def test_every_pipe_command_in_the_workflow_is_a_real_command_with_real_options() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert "pull_request" in workflow[True]  # YAML 1.1 reads the key `on` as True
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    commands = [words for step in steps for words in pipe_commands(step.get("run", ""))]
    assert [words[0] for words in commands] == ["train", "export", "optimize", "export", "check"], commands
    for name, *args in commands:
        command = main.commands.get(name)
        assert command is not None, f"pipe {name} is not a command; there are {sorted(main.commands)}"
        options = {opt for param in command.params if isinstance(param, click.Option) for opt in param.opts}
        used = {arg.split("=")[0] for arg in args if arg.startswith("--")}
        assert used <= options, f"pipe {name} has no option {sorted(used - options)}"
    check = dict(zip(commands[-1][2::2], commands[-1][3::2], strict=False))  # the options after CANDIDATE
    assert check["--baseline"] == "models/$MODEL.baseline.json" and check["--markdown"] == "$GITHUB_STEP_SUMMARY"
    assert {"--junit", "--json"} <= set(check)
    published = [s for s in steps if "junit" in s.get("uses", "")]
    assert published and published[0]["with"]["report_paths"] == check["--junit"]
    assert all("@v" in s["uses"] for s in steps if "uses" in s)  # every action pinned to a major version


def test_the_workflow_parser_finds_a_pipe_command_after_continuations_and_rejects_an_unknown_flag() -> None:
    script = 'mkdir -p reports\n.venv/bin/pipe check "a b" --baseline x.json \\\n  --junit r.xml  # the gate\n'
    assert pipe_commands(script) == [["check", "a b", "--baseline", "x.json", "--junit", "r.xml"]]
    options = {opt for param in main.commands["check"].params for opt in getattr(param, "opts", [])}
    assert "--junit" in options and "--junit-xml" not in options  # a misspelt flag would not pass the test above
