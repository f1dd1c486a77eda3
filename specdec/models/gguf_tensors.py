"""GGUF tensors -> one safetensors file, a tensor (or a slice of rows) at a time.

Dequantizing a whole model into a float32 state dict first needs all of it in memory at once: 6 GB for
Qwen2.5-Coder-1.5B, 12 GB peak with the copies (shared/NOTES.md). Instead the safetensors header is written
from the shapes alone (the transformers model built on the meta device says what every tensor must be), and
each tensor is then dequantized, checked and written on its own. Tensors a tensor processor must see whole
(llama's q/k row permutation) are converted whole; the rest go through in slices of rows, since GGUF's
quantization blocks never cross a row. Peak memory is then the memory-mapped GGUF plus one slice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.errors import CorruptModelError, ModelLoadError

_SLICE_VALUES = 1 << 22  # about 16 MB of float32 per slice
_DTYPES = {"float32": ("F32", 4), "bfloat16": ("BF16", 2)}


@dataclass
class TensorPlan:
    hf_name: str
    tensor: Any  # gguf.ReaderTensor
    shape: tuple[int, ...]


def plan_tensors(reader, architecture: str, config, gguf_path: Path) -> list[TensorPlan]:
    """Which GGUF tensor becomes which transformers tensor, with the shape it must have; raises
    `ModelLoadError` before any dequantizing when a tensor the model needs is missing or mis-shaped."""
    import torch
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    config.architectures = [type(model).__name__]
    shapes = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    arch = next(k for k, v in MODEL_ARCH_NAMES.items() if v == architecture)
    name_map = get_tensor_name_map(arch, config.num_hidden_layers)
    gguf_to_hf = {}
    for hf_name in shapes:
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = name_map.get_name(base)
        if gguf_name is not None:
            gguf_to_hf[f"{gguf_name}.{suffix}"] = hf_name
    plan = [TensorPlan(gguf_to_hf[t.name], t, shapes[gguf_to_hf[t.name]]) for t in reader.tensors
            if t.name in gguf_to_hf]
    expected = [k for k in shapes if not (config.tie_word_embeddings and k == "lm_head.weight")]
    present = {p.hf_name for p in plan}
    missing = [k for k in expected if k not in present]
    if missing:
        raise ModelLoadError(
            f"cannot read GGUF file {gguf_path}: it lacks {len(missing)} tensor(s) the model needs, "
            f"e.g. {', '.join(missing[:3])}"
        )
    for p in plan:
        have = tuple(int(n) for n in reversed(p.tensor.shape))  # GGUF lists the fastest dimension first
        if have != p.shape:
            raise ModelLoadError(
                f"cannot read GGUF file {gguf_path}: tensor {p.hf_name} has shape {have}, the config implies {p.shape}"
            )
    return plan


def write_safetensors(path: Path, plan: list[TensorPlan], dtype: str, architecture: str, config, gguf_path: Path,
                      advance: Callable[[], Any]) -> None:
    """Write every planned tensor, dequantized (llama.cpp's q/k permutation undone) and cast to `dtype`
    ("float32" or "bfloat16"), to the safetensors file `path`. A NaN or Inf raises `CorruptModelError`."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    code, width = _DTYPES[dtype]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    whole = type(processor) is not TensorProcessor  # it may reorder rows: let it see the whole tensor
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for p in plan:
        nbytes = width * _numel(p.shape)
        header[p.hf_name] = {"dtype": code, "shape": list(p.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for p in plan:
            written = 0
            for block in _converted(p, processor, whole, dtype, gguf_path):
                f.write(block)
                written += len(block)
            if written != width * _numel(p.shape):
                raise ModelLoadError(f"cannot read GGUF file {gguf_path}: tensor {p.tensor.name} dequantized to "
                                     f"{written:,} bytes, expected {width * _numel(p.shape):,}")
            advance()


def _converted(p: TensorPlan, processor, whole: bool, dtype: str, gguf_path: Path):
    """The tensor's bytes in `dtype`, in row order, a slice at a time."""
    import numpy as np
    import torch
    from gguf import dequantize

    data = p.tensor.data
    rows = data.shape[0] if data.ndim >= 2 else 1
    step = rows if whole or data.ndim < 2 else max(1, _SLICE_VALUES // max(1, _numel(p.shape) // rows))
    for start in range(0, rows, step):
        chunk = data if step == rows else data[start:start + step]
        try:
            values = dequantize(chunk, p.tensor.tensor_type)
        except Exception as e:
            raise ModelLoadError(f"cannot read GGUF file {gguf_path}: cannot dequantize {p.tensor.name} "
                                 f"({p.tensor.tensor_type.name}): {e}") from e
        if whole:
            values = processor.process(weights=values.reshape(p.shape), name=p.tensor.name).weights
        values = np.require(values, dtype=np.float32, requirements=["C", "W"])  # F32 tensors map read-only
        finite = np.isfinite(values)
        if not finite.all():
            bad = int(finite.size - np.count_nonzero(finite))
            raise CorruptModelError(
                f"cannot convert GGUF file {gguf_path}: tensor {p.tensor.name} holds {bad:,} NaN/Inf value(s) "
                f"of {finite.size:,}. The file is corrupt (a damaged download or disk); get a fresh copy"
            )
        if dtype == "float32":
            yield memoryview(values).cast("B")
        else:  # round to nearest even, as torch's cast does
            yield memoryview(torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy()).cast("B")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
