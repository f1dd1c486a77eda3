"""Transformers as the peer: plain `generate`, prompt lookup, and assisted generation with our own draft model.

The peers load the same weights as our engine (the converted Hugging Face folder of the target) in fp32, and
run greedy at batch 1 like our methods. Transformers reports no acceptance statistics, so a forward hook counts
the target's forward calls: tau = new tokens / target forwards. That is tokens per target pass, the quantity our
RequestMetrics calls tau (our count leaves out the prefill and its one token; over 64 tokens the two
definitions differ by at most ~1/64 at tau 1).

The assistant is the distilled draft that our `draft` drafter uses (`specdec/assets/drafts/<target>`): a
folder of decoder layers and a final norm, trained through the target's own embedding and tied LM head. Here it
becomes a `LlamaForCausalLM` with those layers whose embedding and LM head are the target's own modules, so both
engines draft with exactly the same network.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from specdec.benchmarks.runs import Run

PROMPT_LOOKUP_TOKENS = 5  # the value transformers' docs use; NOTES.md measured it on this model
PEER_NAMES = ("generate", "prompt-lookup", "assisted")


class HFPeer:
    """One transformers generation mode around a shared fp32 model."""

    family = "transformers"

    def __init__(self, key: str, label: str, model, pad_token_id: int, **generate_kwargs) -> None:
        self.key = key
        self.label = label
        self.model = model
        self.pad_token_id = pad_token_id
        self.generate_kwargs = generate_kwargs
        self._forwards = 0
        model.register_forward_hook(self._count)

    def _count(self, *_args) -> None:
        self._forwards += 1

    def run(self, ids: list[int], max_new_tokens: int, ignore_eos: bool) -> Run:
        extra = {"min_new_tokens": max_new_tokens} if ignore_eos else {}
        inputs = torch.tensor([ids], device=self.model.device)
        self._forwards = 0
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new_tokens,
                                      do_sample=False, pad_token_id=self.pad_token_id, **extra,
                                      **self.generate_kwargs)
        tokens = out[0, len(ids):].tolist()
        seconds = time.perf_counter() - start
        return Run(tokens, seconds, len(tokens), max(self._forwards, 1))


def load_hf_target(folder: str | Path, device: str | torch.device = "cpu"):
    """The target through transformers, fp32, from the folder our loader read."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).to(device).eval()


def hf_assistant(target, draft_folder: Path):
    """Our layers-only distilled draft as a transformers `LlamaForCausalLM` on the target's embedding and head.

    The folder's weights carry Hugging Face names already (`model.layers.N...`, `model.norm.weight`); they are
    stored in bf16 and upcast to the target's dtype, as our engine does when it builds the draft.
    """
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec.drafters.heads.draft_folder import WEIGHTS_FILE

    config = LlamaConfig.from_pretrained(str(draft_folder))
    config.tie_word_embeddings = False  # the head is the target's module, set below
    assistant = LlamaForCausalLM(config).to(target.dtype)
    weights = {k: v.to(target.dtype) for k, v in load_file(str(draft_folder / WEIGHTS_FILE)).items()}
    missing, unexpected = assistant.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - {"model.embed_tokens.weight", "lm_head.weight"}:
        raise ValueError(f"draft folder {draft_folder} does not fit a {config.num_hidden_layers}-layer llama: "
                         f"missing {missing}, unexpected {unexpected}")
    assistant.model.embed_tokens = target.get_input_embeddings()
    assistant.lm_head = target.get_output_embeddings()
    return assistant.to(target.device).eval()


def build_peers(names: list[str], folder: str | Path, draft_folder: Path | None, device: str,
                notes: list[str]) -> list[HFPeer]:
    """The requested peers, sharing one fp32 transformers model; skipped peers leave a line in `notes`."""
    from transformers.utils import logging

    logging.set_verbosity_error()  # per-call advice about generation flags would drown the progress bar
    model = load_hf_target(folder, device)
    pad = model.generation_config.eos_token_id
    pad = pad[0] if isinstance(pad, list) else pad
    peers = []
    for name in names:
        if name == "generate":
            peers.append(HFPeer("hf:generate", "transformers generate", model, pad))
        elif name == "prompt-lookup":
            peers.append(HFPeer("hf:prompt-lookup", f"transformers prompt lookup (k={PROMPT_LOOKUP_TOKENS})", model,
                                pad, prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS))
        elif name == "assisted":
            if draft_folder is None:
                notes.append("transformers assisted generation skipped: specdec ships no draft for this target")
                continue
            assistant = hf_assistant(model, draft_folder)
            peers.append(HFPeer("hf:assisted", f"transformers assisted ({draft_folder.name} draft)", model, pad,
                                assistant_model=assistant))
    return peers
