"""GGUF -> HF folder conversion: bad files fail with the path in the message, a tiny llama GGUF written the
way llama.cpp writes one round-trips exactly (q/k permutation undone, tied embeddings not duplicated), and
the real default model converts into the shared cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec.errors import ModelLoadError, OfflineError, UnsupportedModelError
from specdec.models import gguf_convert
from specdec.models.gguf_convert import SOURCE_FILE, convert_gguf, ensure_converted, gguf_cache_dir
from tests.helpers import skip_unless_ci

HIDDEN, HEADS, KV_HEADS, LAYERS, FFN = 64, 4, 2, 2, 96
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHARS = list("abcdefghijklmnopqrstuvwxyz") + ["Ġ", "Ċ"]
MERGES = ["h e", "l l", "he ll"]
VOCAB = SPECIALS + CHARS + [m.replace(" ", "") for m in MERGES]
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (interleaved -> halves rotary layout)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_weights(tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    w = {"model.embed_tokens.weight": rand(len(VOCAB), HIDDEN), "model.norm.weight": rand(HIDDEN)}
    if not tied:
        w["lm_head.weight"] = rand(len(VOCAB), HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = rand(HEADS * head_dim, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = rand(KV_HEADS * head_dim, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = rand(KV_HEADS * head_dim, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = rand(HIDDEN, HEADS * head_dim)
        w[p + "mlp.gate_proj.weight"] = rand(FFN, HIDDEN)
        w[p + "mlp.up_proj.weight"] = rand(FFN, HIDDEN)
        w[p + "mlp.down_proj.weight"] = rand(HIDDEN, FFN)
        w[p + "input_layernorm.weight"] = rand(HIDDEN)
        w[p + "post_attention_layernorm.weight"] = rand(HIDDEN)
    return w


_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}  # fmt: skip


def write_tiny_gguf(path: Path, tied: bool = True, architecture: str = "llama") -> dict[str, np.ndarray]:
    """A small F32 llama GGUF laid out as llama.cpp writes it; returns the HF weights it encodes."""
    import gguf

    hf = _hf_weights(tied)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-test")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_vocab_size(len(VOCAB))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(VOCAB)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(VOCAB) - len(SPECIALS)))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.add_tensor("token_embd.weight", hf["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", hf["model.norm.weight"])
    if not tied:
        writer.add_tensor("output.weight", hf["lm_head.weight"])
    for i in range(LAYERS):
        for hf_part, gguf_part in _GGUF_NAMES.items():
            w = hf[f"model.layers.{i}.{hf_part}.weight"]
            if gguf_part == "attn_q":
                w = _permute(w, HEADS)
            elif gguf_part == "attn_k":
                w = _permute(w, KV_HEADS)
            writer.add_tensor(f"blk.{i}.{gguf_part}.weight", np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_CACHE", str(root))
    return root


# --- bad input -----------------------------------------------------------------------------------------


def test_non_gguf_file_is_a_model_load_error_naming_the_path(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("this is not a model\n" * 10)
    with pytest.raises(ModelLoadError, match="not a GGUF file") as err:
        convert_gguf(path, tmp_path / "out", show_progress=False)
    assert f"cannot read GGUF file {path}" in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("keep", [0.02, 0.5, 0.99])
def test_truncated_gguf_is_a_model_load_error_naming_the_path(tmp_path, keep):
    good = tmp_path / "good.gguf"
    write_tiny_gguf(good)
    data = good.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match="truncated or corrupt") as err:
        convert_gguf(path, tmp_path / "out", show_progress=False)
    assert str(path) in str(err.value)
    assert not (tmp_path / "out").exists()


def test_missing_file_is_a_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="cannot read GGUF file"):
        convert_gguf(tmp_path / "absent.gguf", tmp_path / "out", show_progress=False)


def test_non_llama_architecture_is_unsupported(tmp_path):
    path = tmp_path / "gpt2.gguf"
    write_tiny_gguf(path, architecture="gpt2")
    with pytest.raises(UnsupportedModelError, match="architecture 'gpt2' is not supported") as err:
        convert_gguf(path, tmp_path / "out", show_progress=False)
    assert str(path) in str(err.value)


# --- conversion ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
def test_tiny_gguf_round_trips_to_the_hf_weights(tmp_path, tied):
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    path = tmp_path / "tiny.gguf"
    hf = write_tiny_gguf(path, tied=tied)
    out = convert_gguf(path, tmp_path / "models" / "tiny", show_progress=False)

    assert out == tmp_path / "models" / "tiny"
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]  # no temp dirs left behind
    tensors = load_file(out / "model.safetensors")
    assert set(tensors) == set(hf)  # lm_head only when untied
    for name, expected in hf.items():  # exact: the q/k permutation is undone, nothing else changes
        assert tensors[name].dtype == torch.float32
        assert torch.equal(tensors[name], torch.from_numpy(expected)), name

    config = AutoConfig.from_pretrained(out)
    assert (config.num_hidden_layers, config.hidden_size) == (LAYERS, HIDDEN)
    assert (config.num_attention_heads, config.num_key_value_heads) == (HEADS, KV_HEADS)
    assert config.tie_word_embeddings is tied
    assert config.architectures == ["LlamaForCausalLM"]

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    assert tokenizer.eos_token == "<|im_end|>"
    assert (out / "special_tokens_map.json").is_file()
    assert (out / "generation_config.json").is_file()

    source = json.loads((out / SOURCE_FILE).read_text())
    assert source["source_file"] == "tiny.gguf"
    assert source["size"] == path.stat().st_size
    assert source["sha256"] == gguf_convert._sha256(path)
    assert source["conversion_version"] == gguf_convert.CONVERSION_VERSION
    assert source["tie_word_embeddings"] is tied


def test_converted_folder_loads_in_transformers_with_the_same_logits(tmp_path):
    from transformers import AutoModelForCausalLM

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    out = convert_gguf(path, tmp_path / "tiny", show_progress=False)
    ours = AutoModelForCausalLM.from_pretrained(out)
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    ids = torch.tensor([[1, 5, 9, 30, 2]])
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, theirs(ids).logits)


def test_failed_conversion_leaves_the_previous_folder_and_no_partial_dir(tmp_path, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    out = tmp_path / "models" / "tiny"
    out.mkdir(parents=True)
    (out / "marker").write_text("previous conversion")

    def disk_full(folder, *args):
        (folder / "model.safetensors").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf_convert, "_write_folder", disk_full)
    with pytest.raises(ModelLoadError, match="No space left"):
        convert_gguf(path, out, show_progress=False)
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]
    assert (out / "marker").read_text() == "previous conversion"


def test_stale_partial_dirs_of_dead_processes_are_removed(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    parent = tmp_path / "models"
    dead = parent / ".tiny.partial-999999999-deadbeef"
    dead.mkdir(parents=True)
    convert_gguf(path, parent / "tiny", show_progress=False)
    assert sorted(p.name for p in parent.iterdir()) == ["tiny"]


def test_gguf_cache_dir_is_stable_and_changes_with_the_file(tmp_path, cache):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    first = gguf_cache_dir(path)
    assert first.parent == cache / "gguf" and first.name.startswith("tiny-")
    assert gguf_cache_dir(path) == first
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000_000))
    assert gguf_cache_dir(path) != first


def test_ensure_converted_converts_once(tmp_path, cache, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    folder = ensure_converted(path, show_progress=False)
    assert folder == gguf_cache_dir(path) and (folder / "config.json").is_file()

    def fail(*args, **kwargs):
        raise AssertionError("converted twice")

    monkeypatch.setattr(gguf_convert, "convert_gguf", fail)
    assert ensure_converted(path, show_progress=False) == folder


# --- the real default model ----------------------------------------------------------------------------


@pytest.mark.slow
def test_default_model_resolves_into_the_shared_cache():
    """Fetches and converts SmolLM2-135M once per machine (default cache), then only reads it."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    from specdec.models.registry import ALIASES, cache_root, resolve_alias

    alias = ALIASES["smollm2-135m"]
    try:
        folder = resolve_alias("smollm2-135m")
    except OfflineError as e:
        skip_unless_ci(f"default model not cached and cannot be fetched: {e}")
    assert folder == cache_root() / "models" / "smollm2-135m"

    config = AutoConfig.from_pretrained(folder)
    assert config.model_type == "llama"
    assert config.num_hidden_layers == 30
    assert config.hidden_size == 576
    assert config.num_attention_heads == 9
    assert config.num_key_value_heads == 3
    assert config.vocab_size == 49152
    assert config.tie_word_embeddings is True

    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")

    with safe_open(folder / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [49152, 576]
        assert f.get_slice("model.layers.0.self_attn.q_proj.weight").get_shape() == [576, 576]
        assert f.get_slice("model.layers.29.self_attn.k_proj.weight").get_shape() == [192, 576]
        assert f.get_slice("model.layers.0.mlp.down_proj.weight").get_dtype() == "F32"
    assert len(keys) == 2 + 30 * 9 and "lm_head.weight" not in keys

    source = json.loads((folder / SOURCE_FILE).read_text())
    assert source["sha256"] == alias.sha256 and source["size"] == alias.size


@pytest.mark.slow
def test_default_model_answers_a_factual_question():
    """End-to-end check of the conversion on real weights (a wrong q/k permutation produces gibberish)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.models.registry import resolve_alias

    try:
        folder = resolve_alias("smollm2-135m")
    except OfflineError as e:
        skip_unless_ci(f"default model not cached and cannot be fetched: {e}")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=10, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])


# --- damaged weights -----------------------------------------------------------------------------------


def _corrupt_tensor(path: Path, name: str, fill: bytes = b"\xff") -> None:
    """Overwrite one tensor's data with `fill` bytes, as a damaged download or disk would (issue 18 wrote
    5 MB of 0xff into the real GGUF: all NaN in F32, and NaN block scales in Q4_1)."""
    import gguf

    tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    with path.open("r+b") as f:
        f.seek(tensor.data_offset)
        f.write(fill * tensor.n_bytes)


@pytest.mark.parametrize("fill", [b"\xff", b"\x00\x00\x80\x7f"])  # NaN bytes, +Inf floats
def test_nan_or_inf_weights_are_refused_and_nothing_is_cached(tmp_path, cache, fill):
    from specdec.errors import CorruptModelError
    from specdec.models.loader import resolve_target

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    _corrupt_tensor(path, "blk.1.ffn_down.weight", fill)
    with pytest.raises(CorruptModelError, match=r"blk\.1\.ffn_down\.weight holds [\d,]+ NaN/Inf") as err:
        resolve_target(str(path), show_progress=False)
    assert str(path) in str(err.value)
    assert list((cache / "gguf").glob("*")) == []  # no folder, no partial conversion left


def test_a_file_named_like_a_known_model_must_have_its_published_hash(tmp_path, cache):
    from specdec.errors import CorruptModelError
    from specdec.models.loader import resolve_target
    from specdec.models.registry import ALIASES

    alias = ALIASES["smollm2-135m"]
    path = tmp_path / alias.gguf_filename  # a tiny file under the published name: not the published bytes
    write_tiny_gguf(path)
    with pytest.raises(CorruptModelError, match=f"expected {alias.sha256}"):
        resolve_target(str(path), show_progress=False)
    assert list((cache / "gguf").glob("*")) == []


# --- tensor by tensor, in slices, to bf16 ---------------------------------------------------------------


def _fake_q8_tensor(name: str, rows: int, cols: int, seed: int):
    """A Q8_0 GGUF tensor as the reader presents one: raw blocks [rows, bytes per row], shape fastest-first."""
    from types import SimpleNamespace

    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    qtype = GGMLQuantizationType.Q8_0
    return SimpleNamespace(name=name, tensor_type=qtype, data=quantize(w, qtype), shape=np.array([cols, rows]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sliced_conversion_writes_what_whole_tensor_dequantizing_gives(tmp_path, monkeypatch, dtype):
    """Rows go through in slices (here 3 rows of 64 at a time) and land where a whole-tensor dequantize puts
    them, cast to the stored dtype; the file is a safetensors file any reader opens."""
    from types import SimpleNamespace

    from gguf import dequantize
    from safetensors.torch import load_file

    from specdec.models import gguf_tensors

    tensors = [_fake_q8_tensor("token_embd.weight", 10, 64, 0), _fake_q8_tensor("output.weight", 7, 64, 1)]
    plan = [gguf_tensors.TensorPlan(hf, t, (int(t.shape[1]), int(t.shape[0])))
            for hf, t in zip(["model.embed_tokens.weight", "lm_head.weight"], tensors)]
    monkeypatch.setattr(gguf_tensors, "_SLICE_VALUES", 3 * 64)
    config = SimpleNamespace(to_dict=lambda: {}, model_type="qwen2")
    advanced = []
    out = tmp_path / "model.safetensors"
    gguf_tensors.write_safetensors(out, plan, dtype, "qwen2", config, tmp_path / "x.gguf", lambda: advanced.append(1))
    loaded = load_file(str(out))
    assert len(advanced) == 2
    for p in plan:
        want = torch.from_numpy(dequantize(p.tensor.data, p.tensor.tensor_type)).to(getattr(torch, dtype))
        assert loaded[p.hf_name].dtype == getattr(torch, dtype)
        assert torch.equal(loaded[p.hf_name], want)


def test_bf16_store_and_stop_tokens_reach_the_converted_folder(tmp_path):
    from safetensors import safe_open

    path = tmp_path / "tiny.gguf"
    hf = write_tiny_gguf(path, tied=False)
    out = convert_gguf(path, tmp_path / "out", show_progress=False, store_dtype="bfloat16", eos_token_ids=(2, 0))
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == [2, 0] and config["dtype"] == "bfloat16"
    assert json.loads((out / SOURCE_FILE).read_text())["store_dtype"] == "bfloat16"
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        lm_head = f.get_tensor("lm_head.weight")
        q = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
    assert lm_head.dtype == torch.bfloat16
    assert torch.equal(lm_head, torch.from_numpy(hf["lm_head.weight"]).to(torch.bfloat16))
    assert torch.equal(q, torch.from_numpy(hf["model.layers.0.self_attn.q_proj.weight"]).to(torch.bfloat16))


def test_an_unknown_store_dtype_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="float16"):
        convert_gguf(tmp_path / "x.gguf", tmp_path / "out", show_progress=False, store_dtype="float16")
