"""In CI a missing real model fails the run; elsewhere it skips the tests that need it."""

from __future__ import annotations

import pytest

from tests.helpers import in_ci, skip_unless_ci


@pytest.mark.parametrize("value,expected", [("true", True), ("1", True), ("TRUE", True), ("", False), ("0", False),
                                            ("false", False)])
def test_ci_is_read_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("CI", value)
    assert in_ci() is expected


def test_missing_model_fails_in_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="may not be skipped in CI"):
        skip_unless_ci("default model unavailable offline")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        skip_unless_ci("default model unavailable offline")
