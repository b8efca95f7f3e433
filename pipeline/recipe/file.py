"""Reading a recipe file: YAML text into a validated Recipe (pipeline/recipe/schema.py holds the schema).

YAML parsers forgive what a hand-edited recipe should not get away with: a key given twice keeps
the later value silently, and a syntax error spans several lines with a caret. Both are one
RecipeError here, naming the key or the line and column.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from pipeline.core.errors import RecipeError
from pipeline.recipe.schema import Recipe, parse_recipe


def duplicate_keys(node: yaml.Node | None, path: str = "") -> list[str]:
    """Each key given twice in one mapping of a composed YAML document: its dotted path and both lines.

    YAML parsers keep the later value silently; a recipe edited by hand then trains with a value
    its author did not mean. Merge keys (`<<: *base`) are not duplicates: overriding them is their use.
    """
    found: list[str] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "<complex key>"
            where = f"{path}.{key}" if path else key
            line = key_node.start_mark.line + 1
            if key in seen:
                found.append(f"{where}: key given twice (lines {seen[key]} and {line}); keep one")
            seen.setdefault(key, line)
            found += duplicate_keys(value_node, where)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += duplicate_keys(item, f"{path}[{i}]")
    return found


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe YAML file."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe {path} not found; recipes live in models/*.yaml")
    text = path.read_bytes()
    try:
        duplicates = duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader))
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RecipeError(f"recipe {path} is not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:  # yaml's composer recurses once per nesting level
        raise RecipeError(f"recipe {path} is not valid YAML: nested more than Python's recursion limit") from None
    if duplicates:
        raise RecipeError(f"recipe {path} is invalid: " + "; ".join(duplicates))
    recipe = parse_recipe(raw, str(path), path.parent)
    return recipe.model_copy(update={"digest": hashlib.sha256(text).hexdigest()})


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """yaml's error on one line: where and what (its own text spans lines, with a caret under the spot)."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or not problem:
        return " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context})" if context else "")
