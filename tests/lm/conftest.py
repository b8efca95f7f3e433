from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _few_threads() -> None:
    """Two shared cores: one torch thread per test process keeps the suite from oversubscribing."""
    import torch

    torch.set_num_threads(1)
