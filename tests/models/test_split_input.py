"""SplitInputLinear: the same map as the linear it was cut from, and in int8 each input part keeps its own scale
(EAGLE-1/2's fc over [embedding ; feature])."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specdec.kernels import cpu as cpu_kernels
from specdec.models.quant import quantize_drafter_int8_
from specdec.models.split_input import SplitInputLinear


def _fc(seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(128, 64, bias=True)


def test_the_split_is_the_same_map_in_float():
    fc = _fc()
    split = SplitInputLinear.from_linear(fc, (64, 64))
    x = torch.randn(5, 128)
    torch.testing.assert_close(split(x), fc(x))
    torch.testing.assert_close(split.forward_parts(x[:, :64], x[:, 64:]), fc(x))
    with pytest.raises(ValueError, match="do not add up"):
        SplitInputLinear.from_linear(fc, (64, 32))


@pytest.mark.skipif(not cpu_kernels.available(), reason="the int8 drafter linears need the compiled kernels")
def test_int8_parts_keep_a_small_input_part_that_one_row_scale_would_round_away():
    fc = _fc(1)
    x = torch.cat([0.02 * torch.randn(4, 64), 20 * torch.randn(4, 64)], dim=-1)  # an embedding beside a feature
    small_part = x[:, :64] @ fc.weight[:, :64].T  # what the embedding contributes
    whole, split = nn.Sequential(_fc(1)), nn.Sequential(SplitInputLinear.from_linear(_fc(1), (64, 64)))
    assert quantize_drafter_int8_(whole) == 1 and quantize_drafter_int8_(split) == 2
    no_embedding = torch.cat([torch.zeros(4, 64), x[:, 64:]], dim=-1)
    with torch.inference_mode():  # what each int8 form makes of the embedding: the change it causes
        seen_whole = whole(x) - whole(no_embedding)
        seen_split = split(x) - split(no_embedding)
    scale = small_part.abs().max()
    assert (seen_split - small_part).abs().max() < scale / 10  # the embedding's contribution survives
    assert (seen_whole - small_part).abs().max() > scale / 2  # one row scale rounds most of it away
