"""Non-finite logits stop the step with a clear error (issue 18: a corrupt model emitted token 0 with exit 0)."""

from __future__ import annotations

import pytest
import torch

from specdec.config import SamplingParams
from specdec.drafters.none import NoDrafter
from specdec.engine.health import check_finite_logits
from specdec.errors import NumericalError
from specdec.tree.spec import chain
from tests.helpers import run_all, tiny_engine, tiny_model


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_model_with_non_finite_weights_stops_instead_of_emitting_tokens(bad):
    model = tiny_model(seed=0)
    with torch.no_grad():
        model.layers[1].mlp.down_proj.weight[3, 5] = bad
    engine = tiny_engine(model, NoDrafter(), chain(0))
    seq = engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=4))
    with pytest.raises(NumericalError, match="NaN/Inf logits"):
        run_all(engine)
    assert seq.output_ids == []  # nothing was emitted from the bad pass


def test_finite_logits_pass_and_empty_outputs_are_skipped():
    class Out:
        def __init__(self, logits):
            self.logits = logits

    check_finite_logits([Out(torch.zeros(2, 5)), Out(None), Out(torch.zeros(0, 5))])
    with pytest.raises(NumericalError):
        check_finite_logits([Out(torch.zeros(2, 5)), Out(torch.tensor([[0.0, float("nan")]]))])


def test_nan_in_a_greedy_decode_row_stops_the_step_before_a_prefill_beside_it_emits():
    """Greedy verification's argmax is the NaN check of the rows it reads unprocessed (the engine makes no
    other pass over them), and it runs before the step emits anything: a request whose prefill finishes in
    the same step as the bad decode row gets no first token from that step."""
    model = tiny_model(seed=0)
    engine = tiny_engine(model, NoDrafter(), chain(0))
    decoding = engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=8))
    engine.step()  # its prefill: the first token
    assert len(decoding.output_ids) == 1
    arriving = engine.add_request([4, 5, 6, 7], SamplingParams(max_new_tokens=8))
    run = engine.runner.run

    def poisoned(chunks, **kwargs):
        outs = run(chunks, **kwargs)
        with torch.inference_mode():
            outs[-1].logits[0, 3] = float("nan")  # the decode row (chunks: prefills first, then trees)
        return outs

    engine.runner.run = poisoned
    with pytest.raises(NumericalError, match="NaN/Inf logits"):
        engine.step()
    assert len(decoding.output_ids) == 1 and arriving.output_ids == []
