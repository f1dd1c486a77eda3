"""A linear over concatenated inputs of different scales, kept as one linear per input part so that int8 gives
each part its own activation scale.

EAGLE-1/2's `fc` reads `[embed(x) ; f]`: a token embedding (entries of a few hundredths) beside the target's
final-norm feature (entries up to tens). Int8 activations with one scale per row quantize both halves at the
feature's step, so most of the embedding rounds to zero and the predictor partly loses which token it reads. On
the default model the int8 `fc` cost EAGLE 2-3% of its held-out tau: with its dynamic tree 1.934 without the split
(`bench/results/heldout_tau_eagle_grounded.md`), 1.986 with it (`heldout_tau_eagle_grounded_split.md`). Split by
input columns, each part is an ordinary linear (`quantize_drafter_int8_` makes each a QLinear): two int8 linears
and an add, about 35 us more a forward at one to three rows (0.09 ms a depth in the engine), where a float `fc`
would cost as much and read four times the bytes. EAGLE-3's `fc` reads three residual streams of the target
(layers 2, 15 and 27 of the default model) whose row maxima are about 32, 80 and 370, yet cutting it in three
changed nothing measurable for the EAGLE-3 head trained at stop 45 (held-out tau 1.609 either way with its
dynamic tree, 1.365 cut against 1.378 whole at `chain:k=2`: `bench/results/heldout_tau_eagle3_full*.md`), so it
stays one linear, one call.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class SplitInputLinear(nn.Module):
    """`y = sum_i parts[i](x_i) (+ bias, in part 0)` for `x = [x_0 ; x_1 ; ...]` of the given widths."""

    def __init__(self, parts: list[nn.Module], widths: tuple[int, ...]) -> None:
        super().__init__()
        if len(parts) != len(widths):
            raise ValueError(f"{len(parts)} parts for {len(widths)} input widths")
        self.parts = nn.ModuleList(parts)
        self.widths = tuple(int(w) for w in widths)
        self.in_features = sum(self.widths)

    @classmethod
    def from_linear(cls, linear: nn.Linear, widths: tuple[int, ...]) -> "SplitInputLinear":
        """The same map as `linear`, its weight cut by input columns (its bias goes with the first part)."""
        if sum(widths) != linear.in_features:
            raise ValueError(f"input widths {widths} do not add up to {linear.in_features}")
        parts, start = [], 0
        for i, width in enumerate(widths):
            part = nn.Linear(width, linear.out_features, bias=i == 0 and linear.bias is not None,
                             device=linear.weight.device, dtype=linear.weight.dtype)
            with torch.no_grad():
                part.weight.copy_(linear.weight[:, start: start + width])
                if part.bias is not None:
                    part.bias.copy_(linear.bias)
            parts.append(part)
            start += width
        return cls(parts, widths)

    def forward_parts(self, *xs: Tensor) -> Tensor:
        """The output for the input parts given separately (no concatenation)."""
        out = self.parts[0](xs[0].contiguous())
        for part, x in zip(self.parts[1:], xs[1:]):
            out = out + part(x.contiguous())
        return out

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_parts(*x.split(self.widths, dim=-1))
