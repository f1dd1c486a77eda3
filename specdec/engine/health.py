"""Run-time health checks of a target pass.

A model with damaged weights (a corrupt GGUF converted before conversions were validated, an fp16 overflow)
yields NaN or Inf logits. Argmax over NaN is token 0 and sampling from NaN fails obscurely, so the engine
checks every pass and stops with a clear error instead of emitting garbage tokens with exit code 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.errors import NumericalError


def check_finite_logits(outputs: Sequence) -> None:
    """Raise `NumericalError` when any logits of a pass (`ForwardOutput`s) are NaN or Inf.

    One reduction and one host sync per step: `isfinite(...).all()` per output, stacked.
    """
    flags = [torch.isfinite(out.logits).all() for out in outputs if out.logits is not None and out.logits.numel()]
    if flags and not bool(torch.stack(flags).all()):
        raise NumericalError(
            "the model produced NaN/Inf logits, so its output would be garbage; the request was stopped. "
            "The weights are probably corrupt (re-download or re-convert the model), or the dtype overflows "
            "(try --dtype float32)"
        )
