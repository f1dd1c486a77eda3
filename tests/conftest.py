"""Shared fixtures. The default model is fetched and converted once per machine (into the specdec cache) and
loaded once per test session."""

from __future__ import annotations

import pytest
import torch

from specdec.errors import OfflineError
from tests.helpers import skip_unless_ci


@pytest.fixture(scope="session")
def default_model():
    """The real smollm2-135m (fp32), as our engine loads it."""
    from specdec.models.loader import load_model

    try:
        return load_model("smollm2-135m", show_progress=False)
    except OfflineError as exc:  # a machine without the package index and without the cached model
        skip_unless_ci(f"default model unavailable offline: {exc}")


@pytest.fixture(scope="session")
def default_llm(default_model):
    """An LLM around the already-loaded default model (drafters are switched with `llm.use`)."""
    from specdec.api import LLM

    return LLM.from_loaded(default_model)


@pytest.fixture(scope="session")
def hf_default_model(default_model):
    """The same weights through transformers, the reference implementation."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(default_model.source, dtype=torch.float32).eval()


def pytest_configure(config):
    """One intra-op thread: the suite is thousands of small ops, where OpenMP wake-ups cost more than they
    save, and on a busy 2-core machine a second thread waiting for a descheduled peer makes every op slow."""
    torch.set_num_threads(1)
