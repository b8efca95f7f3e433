"""docs/ci/model-regression.yml run as a recipes-only repository would run it: its steps in order, in a scratch
directory holding only a recipe (with its data) and a baseline, with pipe installed there as a package.

The install step is the one step not run verbatim: there is no network here, so pipe is installed from this
source tree (`pip install --no-deps`) into a scratch virtual environment whose dependencies come from the
project's own environment (a .pth line naming its site-packages), instead of from PyPI and torch's CPU index.
Every other `run:` step runs as written, with PYTHONPATH unset, so `pipe` is the installed package.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from tests.verify.test_target_units import write_houses

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "docs" / "ci" / "model-regression.yml"


def steps() -> list[dict]:
    (job,) = yaml.safe_load(WORKFLOW.read_text())["jobs"].values()
    return job["steps"]


def test_the_workflow_installs_the_package_on_cpu_wheels_caches_the_venv_and_handles_forks() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    (job,) = workflow["jobs"].values()
    env, by_name = job["env"], {s.get("name", s.get("uses")): s for s in job["steps"]}
    install = by_name["Install pipe (CPU wheels)"]["run"]
    assert '--index-url "$TORCH_INDEX" "torch==$TORCH_VERSION"' in install  # torch alone, from its CPU index
    assert env["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
    assert '"pipe-ml[$PIPE_EXTRAS] @ $PIPE_SOURCE"' in install and "pip install pipe " not in install
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "pipe-ml"
    assert f"torch=={env['TORCH_VERSION']}" in project["optional-dependencies"]["train"]  # the version pipe pins
    cache = by_name["Restore the virtual environment"]
    assert cache["uses"].startswith("actions/cache@v") and cache["with"]["path"] == ".venv"
    assert by_name["Install pipe (CPU wheels)"]["if"] == "steps.venv.outputs.cache-hit != 'true'"
    publish = by_name["Publish the JUnit results"]["if"]
    assert "github.event.pull_request.head.repo.full_name == github.repository" in publish  # not on forks
    kept = by_name["Keep the reports, the model card and the benchmark"]
    assert kept["with"]["path"] == "reports/" and kept["if"] == "${{ !cancelled() }}"
    assert all("@v" in s["uses"] for s in job["steps"] if "uses" in s)


def commit_baseline(repo: Path, elsewhere: Path, env: dict[str, str]) -> None:
    """The baseline the repository commits: its recipe trained once, elsewhere, by the same installed pipe (the
    exporter records source paths in model.onnx, so another installation's file differs in size by their length)."""
    pipe, model = str(repo / ".venv" / "bin" / "pipe"), str(elsewhere / "house")
    for args in (["train", str(repo / "models" / "house.yaml"), "--repository", str(elsewhere), "--quiet"],
                 ["export", model], ["optimize", model],
                 ["check", model, "--write-baseline", str(repo / "models" / "house.baseline.json")]):  # fmt: skip
        proc = subprocess.run([pipe, *args], env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-2000:])
    tracked = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file() and ".venv" not in p.parts)
    assert tracked == ["models/house.baseline.json", "models/house.yaml", "models/houses.csv"]  # and nothing else


def _runs(step: dict, files: Path) -> bool:
    """The step's `if:` as the runner would decide it here: no cache, a same-repository run, files as they are."""
    condition = step.get("if", "")
    for pattern in re.findall(r"hashFiles\('([^']+)'\)", condition):
        if not list(files.glob(pattern)):
            return False
    return True


@pytest.mark.slow
def test_the_workflow_runs_from_a_repository_holding_only_a_recipe_and_a_baseline(tmp_path: Path) -> None:
    repo = tmp_path / "recipes-repo"
    (repo / "models").mkdir(parents=True)
    write_houses(repo / "models")  # models/house.yaml and models/houses.csv
    github = tmp_path / "github"
    github.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(GITHUB_PATH=str(github / "path"), GITHUB_STEP_SUMMARY=str(github / "summary.md"), CI="true")
    (job,) = yaml.safe_load(WORKFLOW.read_text())["jobs"].values()
    env.update({k: str(v) for k, v in job["env"].items()})
    ran = []
    for step in steps():
        if "run" not in step or not _runs(step, repo):
            continue
        script = step["run"]
        if step["name"] == "Install pipe (CPU wheels)":  # the one local stand-in: see the module docstring
            site = sysconfig.get_paths()["purelib"]
            script = (
                f"{sys.executable} -m venv .venv\n"
                f"echo {site} > .venv/lib/python3.11/site-packages/project-environment.pth\n"
                f".venv/bin/pip install --quiet --no-deps --no-build-isolation --no-index {ROOT}\n"
            )
        path = github / "path"
        extra = path.read_text().split() if path.exists() else []
        env["PATH"] = os.pathsep.join([*extra, env["PATH"]])
        proc = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=900)  # fmt: skip
        assert proc.returncode == 0, (step["name"], proc.stdout[-3000:], proc.stderr[-3000:])
        ran.append(step["name"])
        if step["name"] == "Install pipe (CPU wheels)":
            commit_baseline(repo, tmp_path / "elsewhere", env)
    assert ran == ["Install pipe (CPU wheels)", "Put pipe on the PATH", "Train, export and optimize the candidate",
                   "Check it against the committed baseline", "Write the job summary",
                   "Benchmark and write the model card"]  # fmt: skip

    where = [str(repo / ".venv" / "bin" / "python"), "-c", "import pipeline; print(pipeline.__file__)"]
    installed = subprocess.run(where, cwd=repo, env=env, capture_output=True, text=True, check=True).stdout
    assert str(repo / ".venv") in installed  # the package, not this source tree
    reports = repo / "reports"
    assert {"check.xml", "check.md", "check.json", "benchmark.json", "model-card.md"} <= {
        p.name for p in reports.iterdir()
    }
    assert "all checks hold" in (github / "summary.md").read_text()
    card = (reports / "model-card.md").read_text()
    assert "| model | runtime | precision | status |" in card and "| mae |" in card and "the units of `price`" in card
