"""Fixtures for the text-model tests: tiny transformers directories made here (nothing downloaded) and the
artifacts `pipe import DIR` makes from them, shared by the tests of a session (building one takes seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.artifact.directory import Artifact
from pipeline.export.hf import HFSettings, import_hf
from tests.text_models import save_bert


@pytest.fixture(scope="session")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer BERT encoder (hidden 32) with its WordPiece tokenizer, as save_pretrained writes them."""
    return save_bert(tmp_path_factory.mktemp("hf") / "bert", "embedding")


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer BERT sequence classifier, id2label {0: neg, 1: pos}."""
    return save_bert(tmp_path_factory.mktemp("hf") / "classifier", "classification")


@pytest.fixture(scope="session")
def text_repository(tmp_path_factory: pytest.TempPathFactory, bert_dir: Path, classifier_dir: Path) -> Path:
    """artifacts/: `embed` (mean pooling, normalized) and `sentiment` (the classifier), both imported."""
    repo = tmp_path_factory.mktemp("text") / "artifacts"
    import_hf(bert_dir, "embed", repo, HFSettings("embedding", "mean", normalize=True))
    import_hf(classifier_dir, "sentiment", repo, HFSettings("classification"))
    return repo


@pytest.fixture(scope="session")
def embed_artifact(text_repository: Path) -> Artifact:
    return Artifact.load(text_repository / "embed" / "1")
