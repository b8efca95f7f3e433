"""The map is held true: docs/architecture.md names every module of pipeline/ and each name it gives a
module exists there, its contract table says what pyproject.toml's layer contracts say, and every path
the docs, the Makefile and the code's comments cite exists (STYLE item 20).

Plain file reading, no pipe import: a second or two.
"""

from __future__ import annotations

import io
import re
import tokenize
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# A backticked Python name in a layout row, maybe called: `hop_policy(hop, ...)`, `Artifact.load`.
NAME = re.compile(r"`([A-Za-z_]\w*(?:\.\w+)*)(?:\([^`]*\))?`")
# A path inside this repository: the tree's top folders, down to a file with its extension or a folder.
PATH = re.compile(r"(?<![\w/.-])((?:pipeline|tests|bench|docs)/(?:[\w.-]+/)*(?:[\w-]+\.(?:py|md|ya?ml|toml|json)\b)?)")
# A module and a name in it: `runtime/external_data.py:external_files`, `tests/conftest.py:SERIAL_MODULES`.
PATH_NAME = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.py):([A-Za-z_]\w*)")
BARE_DOC = re.compile(r"(?<![\w.-])([\w-]+\.md)\b")  # shared/DESIGN.md too: not in this repository
BARE_MODULE = re.compile(r"(?<![\w/.-])([\w-]+\.py)\b")
# Paths of other projects the code cites as they spell them: KServe's protocol documents.
FOREIGN = ("docs/protocol/",)


def layout_rows() -> Iterator[tuple[str, str]]:
    """Each row of the code layout's tables: its first cell (the modules) and the rest (what they hold)."""
    layout = ARCHITECTURE.read_text().split("## Code layout", 1)[1].split("\n## ", 1)[0]
    for line in layout.splitlines():
        if line.startswith("| `pipeline/"):
            first, rest = line[2:].split(" | ", 1)
            yield first, rest


def row_modules(first: str, rest: str) -> tuple[set[Path], set[Path]]:
    """The modules a row names (`pipeline/PKG/NAME.py`, `NAME.py` beside it in the first cell, or in a package
    row's text) and the folders its first cell names."""
    paths = re.findall(r"`(pipeline/[\w/]*?(?:\w+\.py)?)`", first)
    folders = {ROOT / (path if path.endswith("/") else path.rsplit("/", 1)[0]) for path in paths}
    named = {ROOT / path for path in paths if path.endswith(".py")}
    package_row = any(path.endswith("/") for path in paths)
    for file in re.findall(r"`(\w+\.py)`", first + (rest if package_row else "")):
        named |= {folder / file for folder in folders if (folder / file).is_file()}
    return named, folders


def test_every_module_of_pipeline_is_in_the_layout() -> None:
    named: set[Path] = set()
    for first, rest in layout_rows():
        named |= row_modules(first, rest)[0]
        named |= {ROOT / path for path in re.findall(r"`(pipeline/[\w/]+\.py)`", rest)}  # a full path in the text
    modules = {path for path in (ROOT / "pipeline").rglob("*.py") if path.name != "__init__.py"}
    missing = sorted(str(path.relative_to(ROOT)) for path in modules - named)
    assert not missing, f"docs/architecture.md's code layout does not name {missing}: add a row or a mention"


def test_every_name_a_layout_row_gives_is_in_its_modules() -> None:
    wrong = []
    for first, rest in layout_rows():
        modules, folders = row_modules(first, rest)
        sources = modules | {path for folder in folders for path in folder.rglob("*.py")}
        text = "\n".join(path.read_text() for path in sources)
        for match in NAME.finditer(rest):
            leaf = match.group(1).rsplit(".", 1)[-1]
            if re.search(r"\.(py|md|json|npz|yaml|txt|onnx|tflite|pbtxt|jsonl|data|png)$", match.group(1)):
                continue  # a file name, checked as a path
            if not re.search(rf"\b{re.escape(leaf)}\b", text):
                wrong.append(f"{first}: {match.group(0)}")
    assert not wrong, f"docs/architecture.md names what its modules do not hold: {wrong}"


def test_the_contract_table_states_pyprojects_layers() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    doc = ARCHITECTURE.read_text()
    for contract in contracts:
        if contract["type"] != "layers" or contract["id"] == "layers":
            continue
        row = next(line for line in doc.splitlines() if line.startswith(f"| `{contract['id']}`"))
        stated = row.split("(", 1)[1].split(")", 1)[0]
        said = [set(layer.replace("\\|", "|").split(" | ")) for layer in re.findall(r"`([^`]+)`", stated)]
        placed = [{name.strip() for name in layer.split("|")} for layer in contract["layers"]]
        assert said == placed, f"docs/architecture.md's {contract['id']} row says {said}; pyproject.toml has {placed}"
    # the packages' own layers, drawn as a figure: one line a layer, top first
    figure = doc.split("The packages stand in layers", 1)[1].split("```", 2)[1]
    drawn = [{name.strip() for name in line.split("  ")[0].split("|")} for line in figure.strip().splitlines()]
    packages = next(contract for contract in contracts if contract["id"] == "layers")["layers"]
    assert drawn == [{name.strip() for name in layer.split("|")} for layer in packages]


def cited_texts() -> list[tuple[str, int, str]]:
    """Every doc line, Makefile line, and comment or string of our Python: (file, line, text)."""
    texts = []
    for path in [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", ROOT / "Makefile"]:
        texts += [(str(path.relative_to(ROOT)), n, line) for n, line in enumerate(path.read_text().splitlines(), 1)]
    for path in sorted(path for folder in ("pipeline", "tests", "bench") for path in (ROOT / folder).rglob("*.py")):
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type in (tokenize.COMMENT, tokenize.STRING):
                texts.append((str(path.relative_to(ROOT)), token.start[0], token.string))
    return texts


def test_every_path_the_docs_makefile_and_comments_cite_exists() -> None:
    texts = cited_texts()
    pages = {path.name for path in (ROOT / "docs").rglob("*.md")} | {"README.md"}
    sources: dict[str, list[Path]] = {}  # a module's file name -> where it is
    for folder in ("pipeline", "tests", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            sources.setdefault(path.name, []).append(path)
    written = {  # the Markdown files pipe itself writes (reports/model-card.md, ...): a string that is a path
        Path(literal.strip("\"'")).name
        for where, _, literal in texts
        if where.startswith("pipeline/") and re.fullmatch(r"[\"'][\w/.-]+\.md[\"']", literal)
    }
    wrong = []
    for where, number, text in texts:
        for match in PATH.finditer(text):
            cited = match.group(1)
            placeholder = re.search(r"/(NAME|PKG|N)[./]", cited)
            if cited.startswith(FOREIGN) or not re.search(r"\.\w+$|/$", cited) or placeholder:
                continue  # another project's path, a stem ("bench/results/serve": .json and .md), a NAME
            if not (ROOT / cited).exists():
                wrong.append(f"{where}:{number}: {cited}")
        for match in PATH_NAME.finditer(text):
            file, name = match.groups()
            found = [path for path in sources.get(Path(file).name, []) if path.as_posix().endswith(file)]
            if found and not any(re.search(rf"\b{name}\b", path.read_text()) for path in found):
                wrong.append(f"{where}:{number}: {file}:{name}")
        if where.startswith(("pipeline/", "docs/", "README", "Makefile")):
            text = re.sub(r"\S*(?:docs/protocol/|(?<![\w.])/tmp/)\S*", "", text)  # KServe's pages, scratch files
            # a bare page or module name: a page of docs/ (or a file pipe writes), a module of pipeline/
            wrong += [f"{where}:{number}: {m}" for m in BARE_DOC.findall(text) if m not in pages | written]
            if where.startswith("pipeline/"):
                wrong += [f"{where}:{number}: {m}" for m in BARE_MODULE.findall(text) if m not in sources]
    assert not wrong, "cited but not in this repository:\n" + "\n".join(wrong)
