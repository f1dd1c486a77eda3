"""Target features over a corpus, for training feature drafters (Medusa heads, EAGLE predictors).

Both trainers need, for every prompt + answer of a self-distillation corpus, what the engine hands a feature
drafter at run time: the target's final-norm hidden states (Medusa, EAGLE-1/2) or the residual streams entering
a few layers (EAGLE-3). One dense causal forward per batch gives them for every position at once; they are kept
in bf16 on the CPU (72k tokens x 576 x 2 bytes is ~80 MB per feature for the default model's corpus).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdec.models.llama import LlamaModel
from specdec.models.dense import dense_forward
from specdec.training.common import Corpus, Progress, _no_progress


@dataclass
class Features:
    """Per sequence (prompt + answer): final hidden states, and captured layer inputs if asked for."""

    hidden: list[Tensor] = field(default_factory=list)  # [T_i, H] bf16, final-norm hidden states
    layers: dict[int, list[Tensor]] = field(default_factory=dict)  # layer -> [T_i, H] bf16 inputs of that layer
    seconds: float = 0.0


@torch.inference_mode()
def record_features(target: LlamaModel, corpus: Corpus, capture_layers: tuple[int, ...] = (),
                    batch_tokens: int = 4096, progress: Progress = _no_progress) -> Features:
    """Run the target densely over every corpus sequence, batching sequences up to `batch_tokens` (padded).

    Sequences go through in order of length (so a batch pads little: corpora mix 20- and 600-token
    sequences), and come back in corpus order."""
    sequences = [p + r for p, r in zip(corpus.prompt_ids, corpus.response_ids)]
    n = len(sequences)
    order = sorted(range(n), key=lambda i: len(sequences[i]))
    hidden_of: list[Tensor | None] = [None] * n
    layers_of: dict[int, list[Tensor | None]] = {i: [None] * n for i in capture_layers}
    seconds, done = 0.0, 0
    progress("features", 0, n, {})
    while done < n:
        start = time.perf_counter()
        batch = [order[done]]
        longest = len(sequences[batch[0]])
        while done + len(batch) < n and max(longest, len(sequences[order[done + len(batch)]])) * (len(batch) + 1) <= batch_tokens:
            batch.append(order[done + len(batch)])
            longest = max(longest, len(sequences[batch[-1]]))
        ids = torch.zeros(len(batch), longest, dtype=torch.int64)
        for row, i in enumerate(batch):
            ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
        capture: dict[int, Tensor] | None = {i: None for i in capture_layers} if capture_layers else None
        hidden = dense_forward(target, ids.to(target.device), capture)
        for row, i in enumerate(batch):
            length = len(sequences[i])
            hidden_of[i] = hidden[row, :length].to("cpu", torch.bfloat16)
            for layer in capture_layers:
                layers_of[layer][i] = capture[layer][row, :length].to("cpu", torch.bfloat16)
        done += len(batch)
        seconds += time.perf_counter() - start
        progress("features", done, n, {})
    features = Features(hidden=hidden_of, layers=layers_of, seconds=seconds)
    return features
