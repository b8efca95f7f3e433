"""The recipe (models/*.yaml, docs/recipes.md): one model declared end to end.

- `schema`: the typed schema (pydantic, strict), `parse_recipe`, `stage_settings` (the sections each stage reads).
- `file`: `load_recipe`, a recipe file read as YAML (duplicate keys and syntax errors one line each).
- `current`: the recipe a later stage reads for an artifact (`current_recipe`) and `section_settings`,
  a section with the command line's overrides on top, validated.
"""
