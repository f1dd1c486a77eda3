"""The sampling controls of SamplingParams: neutral defaults, normalised values, and one clear ConfigError
naming the field for every bad value."""

from __future__ import annotations

import pytest

from specdec.config import SamplingParams
from specdec.errors import ConfigError


def test_defaults_are_neutral():
    p = SamplingParams()
    assert not p.penalised
    assert (p.repetition_penalty, p.frequency_penalty, p.presence_penalty, p.min_p) == (1.0, 0.0, 0.0, 0.0)
    assert p.logit_bias == () and p.stop_token_ids == () and p.min_new_tokens == 0
    assert p.logprobs is None and p.n == 1


def test_logit_bias_dict_becomes_sorted_pairs_and_params_stay_hashable():
    p = SamplingParams(logit_bias={7: 1.5, 2: -3})
    assert p.logit_bias == ((2, -3.0), (7, 1.5)) and p.bias == {2: -3.0, 7: 1.5}
    assert hash(p) == hash(SamplingParams(logit_bias=[(7, 1.5), (2, -3)]))
    assert p.penalised


def test_stop_token_ids_become_a_tuple():
    assert SamplingParams(stop_token_ids=[4, 9]).stop_token_ids == (4, 9)


@pytest.mark.parametrize("field,value,words", [
    ("repetition_penalty", 0, "(0, 100]"),
    ("repetition_penalty", "2", "(0, 100]"),
    ("frequency_penalty", 2.5, "-2 to 2"),
    ("presence_penalty", -3, "-2 to 2"),
    ("presence_penalty", float("nan"), "-2 to 2"),
    ("min_p", 1.5, "[0, 1]"),
    ("min_p", True, "[0, 1]"),
    ("logit_bias", {"5": 1.0}, "token ids"),
    ("logit_bias", {-1: 1.0}, "token ids"),
    ("logit_bias", {5: 101}, "-100 to 100"),
    ("logit_bias", [(5, 1.0), (5, 2.0)], "twice"),
    ("logit_bias", "5:1", "dict"),
    ("stop_token_ids", "5", "list of token ids"),
    ("stop_token_ids", [1, -2], "integers >= 0"),
    ("min_new_tokens", -1, "0 to max_new_tokens"),
    ("min_new_tokens", 200, "0 to max_new_tokens (128)"),
    ("logprobs", 21, "0 to 20"),
    ("logprobs", True, "0 to 20"),
    ("n", 0, "1 to 128"),
    ("n", 2.0, "1 to 128"),
])
def test_bad_values_raise_a_config_error_naming_the_field(field, value, words):
    with pytest.raises(ConfigError, match=field) as info:
        SamplingParams(**{field: value})
    assert info.value.field == field
    assert words in str(info.value)
