"""What a causal LM directory may not bring into an artifact, refused at `pipe import` (exit 2, naming the file
and the fix) before anything is exported; and a chat template changed after import, refused when the manifest
is read. Hostile input, issue 50: each of these imported with exit 0 before and failed later, or served the
wrong prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from pipeline.artifact.generation import read_generation
from pipeline.artifact.manifest import Manifest
from pipeline.cli.group import main
from pipeline.core.errors import ArtifactError, InputError
from tests.lm.lm_models import save_bpe_tokenizer, save_llama


def imported(source: Path, repository: Path) -> Result:
    return CliRunner().invoke(main, ["import", str(source), "--name", "m", "--repository", str(repository)])


def test_an_eos_id_past_the_vocabulary_is_refused_before_the_export(tmp_path: Path) -> None:
    source = save_llama(tmp_path / "src")
    (source / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 500]}))
    result = imported(source, tmp_path / "repo")
    assert result.exit_code == 2, result.output
    assert "eos_token_id [500] is past the model's vocabulary (ids 0..319)" in result.output
    assert not (tmp_path / "repo" / "m").exists()  # nothing half-written


def test_a_chat_template_linked_outside_the_model_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("root:x:0:0\n")
    source = save_bpe_tokenizer(tmp_path / "src")
    (source / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    (source / "chat_template.jinja").unlink(missing_ok=True)
    (source / "chat_template.jinja").symlink_to(outside)
    with pytest.raises(InputError, match=r"chat_template.jinja is a link to .*secret.txt, outside"):
        read_generation(source)
    inside = source / "template.txt"
    inside.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    (source / "chat_template.jinja").unlink()
    (source / "chat_template.jinja").symlink_to(inside)  # a link within the directory is the file
    assert read_generation(source).chat_template == inside.read_text()


def test_a_chat_template_that_does_not_compile_is_refused_naming_its_line(tmp_path: Path) -> None:
    source = save_bpe_tokenizer(tmp_path / "src")
    (source / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    (source / "chat_template.jinja").write_text("{% for m in messages %}\n{{ m['content'] }\n")
    with pytest.raises(InputError, match=r"the chat template does not compile: line 2: .*fix chat_template.jinja"):
        read_generation(source)


@pytest.mark.slow  # one import of a tiny Llama
def test_a_chat_template_changed_and_rehashed_after_import_is_refused(tmp_path: Path) -> None:
    """Edited and its sha256 in `files` updated to match, the template would be served while the manifest's
    generation record (in the identity digest) still names the template imported."""
    result = imported(save_llama(tmp_path / "src"), tmp_path / "repo")
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "repo" / "m" / "1" / "manifest.json").read_text())
    Manifest.from_dict(data)  # as imported: it holds
    data["files"]["tokenizer/chat_template.jinja"]["sha256"] = "ab" * 32
    with pytest.raises(ArtifactError, match=r"generation.chat_template_sha256: .* the template was changed"):
        Manifest.from_dict(data)
