"""Weights moved onto huge pages keep their values, identity and sharing, and the model's output."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specdec.api import LLM
from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.models import huge_pages
from specdec.models.huge_pages import move_to_huge_pages
from specdec.models.loader import LoadedModel, build_model
from specdec.models.quant import quantize_model_int8_
from tests.drafters.test_eagle import random_predictor
from tests.helpers import NoTokenizer, tiny_config, tiny_model

pytestmark = pytest.mark.skipif(not huge_pages.supported(), reason="no transparent huge pages on this system")


@pytest.fixture(autouse=True)
def any_size(monkeypatch):
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 0)  # tiny models are far below a huge page


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds `address`."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_weights_keep_values_identity_and_sharing():
    model = tiny_model(0)
    model.lm_head.weight = model.embed_tokens.weight  # tied, as SmolLM2's
    model.register_buffer("first_row", model.embed_tokens.weight.data[1])  # a view into a parameter's storage
    before = {name: t.detach().clone() for name, t in (*model.named_parameters(), *model.named_buffers())}
    objects = {name: id(t) for name, t in (*model.named_parameters(), *model.named_buffers())}
    assert move_to_huge_pages(model) > 0
    after = dict((*model.named_parameters(), *model.named_buffers()))
    assert {name: id(t) for name, t in after.items()} == objects
    for name, tensor in after.items():
        assert torch.equal(tensor, before[name]), name
    assert model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()
    assert model.first_row.data_ptr() == model.embed_tokens.weight[1].data_ptr()
    address = model.layers[0].mlp.down_proj.weight.data_ptr()
    assert address % 64 == 0
    assert "hg" in _vm_flags(address)  # the arena is advised MADV_HUGEPAGE
    with torch.no_grad():
        model.embed_tokens.weight[1, 0] = 7.0  # still one storage: a write through one is seen by the others
    assert model.first_row[0] == 7.0 and model.lm_head.weight[1, 0] == 7.0


def test_what_no_step_streams_stays_put():
    """An untied embedding (one row read a token) and, where the kernels read QLinear's 16-channel blocks, its
    4-channel tiles are left where they are; everything else moves."""
    from specdec.kernels import cpu as cpu_kernels

    model = build_model(tiny_config(hidden=64, heads=2, kv_heads=1), None, torch.float32, torch.device("cpu"), seed=5)
    quantize_model_int8_(model)  # 64-wide rows: QLinear keeps 16-channel blocks on AVX-512
    embedding = model.embed_tokens.weight.data_ptr()
    assert move_to_huge_pages(model) > 0
    assert model.embed_tokens.weight.data_ptr() == embedding
    linear = model.layers[0].mlp.down_proj
    in_arena = {name: buf.untyped_storage().data_ptr() in huge_pages._ARENAS for name, buf in linear.named_buffers()
                if buf is not None}
    assert in_arena["weight_scale"]
    if linear.weight_blocks is not None and cpu_kernels.blocked_weights():
        assert in_arena["weight_blocks"] and not in_arena["weight"]
    else:
        assert in_arena["weight"]


def test_a_second_call_moves_only_new_tensors_and_off_moves_nothing(monkeypatch):
    model = tiny_model(1)
    assert move_to_huge_pages(model) > 0
    assert move_to_huge_pages(model) == 0
    model.extra = nn.Linear(4, 4)
    assert move_to_huge_pages(model) > 0
    monkeypatch.setenv("SPECDEC_HUGE_PAGES", "0")
    other = tiny_model(2)
    assert move_to_huge_pages(other) == 0


def test_llm_moves_the_target_and_decodes_the_same():
    """An int8 target on huge pages gives the same greedy tokens as a copy left on the heap."""
    prompts = [[1, 2, 3], [4, 5, 6, 7]]

    def generate(pages: bool) -> tuple[LLM, list[list[int]]]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SPECDEC_HUGE_PAGES", "1" if pages else "0")
            loaded = LoadedModel(tiny_model(3), NoTokenizer(), "dummy:tiny")
            quantize_model_int8_(loaded.model)
            loaded.quantized = "int8"
            llm = LLM.from_loaded(loaded, "recycle", quantize="int8")
            outs = llm.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True))
            return llm, [out.token_ids for out in outs]

    moved, tokens = generate(True)
    _, reference = generate(False)
    assert tokens == reference
    weight = moved.model.layers[0].self_attn.o_proj.weight
    assert weight.untyped_storage().data_ptr() in huge_pages._ARENAS


def test_drafters_name_the_weights_they_read():
    target = tiny_model(4)
    eagle = EagleDrafter(random_predictor(target, 1), target, EngineConfig())
    assert eagle.weights() == [eagle.predictor]
    hybrid = HybridDrafter([("suffix", SuffixDrafter()), ("eagle", eagle)])
    assert hybrid.weights() == [eagle.predictor]
    assert SuffixDrafter().weights() == []


def test_the_default_llm_moves_the_shipped_eagle_head(default_llm):
    default_llm.use("hybrid:suffix+eagle:depth=1")
    try:
        for module in (default_llm.model, *default_llm.drafter.weights()):
            for tensor in module.parameters():
                assert tensor.untyped_storage().data_ptr() in huge_pages._ARENAS
    finally:
        default_llm.use("none")


def test_a_move_after_the_first_forward_is_followed_by_the_cached_plan(monkeypatch):
    """The fast path's LayerWeights hold the tensors themselves, so weights moved after it was built are read at
    their new place: a change written into the moved weights shows in the next generation, as it does in a
    model changed before its first forward."""
    monkeypatch.setenv("SPECDEC_HUGE_PAGES", "0")
    params = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)

    def llm_of(seed: int) -> tuple[LLM, LoadedModel]:
        loaded = LoadedModel(tiny_model(seed), NoTokenizer(), "dummy:tiny")
        quantize_model_int8_(loaded.model)
        loaded.quantized = "int8"
        return LLM.from_loaded(loaded, "none", quantize="int8"), loaded

    def amplify_mlps(model) -> None:  # every MLP's output scaled up: a different model, visibly
        with torch.no_grad():
            for layer in model.layers:
                layer.mlp.down_proj.weight_scale.mul_(1000.0)

    reference_llm, reference = llm_of(6)
    amplify_mlps(reference.model)
    expected = [out.token_ids for out in reference_llm.generate([[1, 2, 3]], params)]
    llm, loaded = llm_of(6)
    before = [out.token_ids for out in llm.generate([[1, 2, 3]], params)]  # builds and caches the plan
    assert before != expected
    monkeypatch.setenv("SPECDEC_HUGE_PAGES", "1")
    assert move_to_huge_pages(loaded.model) > 0
    assert loaded.model.layers[1].mlp.down_proj.weight_scale.untyped_storage().data_ptr() in huge_pages._ARENAS
    amplify_mlps(loaded.model)
    assert [out.token_ids for out in llm.generate([[1, 2, 3]], params)] == expected


def test_nothing_moves_where_the_system_gives_no_huge_pages(monkeypatch, tmp_path):
    """Transparent huge pages set to `never`, or absent: no copy for nothing, and the model stays as it was."""
    policy = tmp_path / "enabled"
    policy.write_text("always madvise [never]\n")
    monkeypatch.setattr(huge_pages, "THP_POLICY", str(policy))
    assert not huge_pages.supported()
    model = tiny_model(8)
    where = model.layers[0].mlp.down_proj.weight.data_ptr()
    assert move_to_huge_pages(model) == 0 and model.layers[0].mlp.down_proj.weight.data_ptr() == where
    policy.write_text("always [madvise] never\n")
    assert huge_pages.supported()
    monkeypatch.setattr(huge_pages, "THP_POLICY", str(tmp_path / "missing"))
    assert not huge_pages.supported()
