from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="module")
def _few_threads() -> Iterator[None]:
    """Two shared cores: one torch thread per test process keeps these tests from oversubscribing; the
    setting is given back after each module, so the tests of other folders keep theirs."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
