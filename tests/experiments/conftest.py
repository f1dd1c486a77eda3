from __future__ import annotations

import pytest

from tests.experiments.tiny import tiny_loaded


@pytest.fixture(scope="module")
def tiny_llm():
    """An LLM around a tiny random model; tests switch drafters with `use` (measure_acceptance does)."""
    from specdec.api import LLM

    return LLM.from_loaded(tiny_loaded())
