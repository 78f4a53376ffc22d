import os

import pytest

# Two cores: keep each test process to one torch thread so parallel runs (pytest -n) do not thrash.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    try:
        import torch
    except ImportError:  # analysis-only environments
        yield
        return
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One warm-started smoke model for the whole session (shared by every CLI test)."""
    return tmp_path_factory.mktemp("cache")
