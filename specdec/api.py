"""The library API: `LLM(...)`, `LLM.generate(...)`, `LLM.stream(...)`.

Shaped like vLLM's offline API so that users can switch with little effort, with speculative decoding as a
constructor argument (`drafter=`, `tree=`) rather than a separate class.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence as Seq

import torch

from specdec.engine.planner import SpeculationPlanner
from specdec.config import WEIGHT_BITS, EngineConfig, SamplingParams
from specdec.drafters.base import DrafterContext
from specdec.drafters.registry import build_drafter
from specdec.engine.engine import Engine
from specdec.errors import ConfigError
from specdec.models.huge_pages import move_to_huge_pages
from specdec.models.loader import LoadedModel, load_model
from specdec.engine.outputs import RequestOutput, output_of
from specdec.engine.sequence import Sequence
from specdec.sampling.seeds import per_sample
from specdec.tree.spec import TreeSpec, parse_tree_spec
from specdec.validation import (
    check_drafter_and_tree, check_kv_cache_dtype, check_kv_cache_fits, check_llm_args, check_messages,
    check_quantize, check_text, check_token_ids, check_tree_size, params_list, prompt_kind, prompts_list,
)

Prompt = str | list[int] | list[dict]  # text, token ids, or chat messages


@dataclass(frozen=True)
class StreamDelta:
    """New output of one request since the last delta."""

    index: int  # position of the request in the prompts given to `stream`
    text: str  # newly decoded text
    token_ids: list[int]  # newly generated tokens
    step_tokens: int  # tokens this request emitted in the target step that produced this delta
    finished: bool
    output: RequestOutput | None  # the final output, on the last delta
    sources: tuple[str, ...] = ()  # per new token, the drafter(s) that proposed it ("" = the target's own token);
    #                                empty unless several drafters build the trees (hybrid)
    sample: int = 0  # which of the prompt's `n` samples (SamplingParams.n) this delta belongs to


class LLM:
    def __init__(
        self,
        target: str = "smollm2-135m",
        device: str = "cpu",
        dtype: str = "float32",
        drafter: str = "none",
        tree: str | None = None,
        quantize: str | None = None,
        engine_config: EngineConfig | None = None,
        show_progress: bool = True,
        num_threads: int | None = None,
    ) -> None:
        # Every argument, the drafter's options and the tree included, is checked before the model loads.
        check_llm_args(target=target, device=device, dtype=dtype, drafter=drafter, tree=tree, quantize=quantize,
                       engine_config=engine_config, show_progress=show_progress, num_threads=num_threads)
        if num_threads is None and str(device).startswith("cpu"):
            num_threads = default_cpu_threads()
        if num_threads:
            torch.set_num_threads(num_threads)
        # int8/int4 quantize as the layers load: a 1.5B model never holds its float32 weights at once
        loaded = load_model(target, device, dtype, show_progress=show_progress,
                            quantize=None if quantize == "none" else quantize)
        self._setup(loaded, target, drafter, tree, quantize, engine_config)

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, drafter: str = "none", tree: str | None = None,
                    quantize: str | None = None, engine_config: EngineConfig | None = None) -> "LLM":
        """An LLM around a model already in memory (tests, benches comparing drafters on one model)."""
        if engine_config is not None and not isinstance(engine_config, EngineConfig):
            raise ConfigError(f"engine_config must be an EngineConfig, got {type(engine_config).__name__}")
        check_quantize(quantize, loaded.model.device.type)
        check_drafter_and_tree(drafter, tree, engine_config or EngineConfig(), quantize)
        llm = cls.__new__(cls)
        llm._setup(loaded, loaded.source, drafter, tree, quantize, engine_config)
        return llm

    def _setup(self, loaded: LoadedModel, target: str, drafter: str, tree: str | None, quantize: str | None,
               engine_config: EngineConfig | None) -> None:
        self.loaded = loaded
        self.target = target
        self.quantize = quantize
        check_quantize(quantize, loaded.model.device.type)
        if quantize == "none":
            quantize = self.quantize = None
        if loaded.quantized != quantize:
            if quantize not in WEIGHT_BITS or loaded.quantized is not None:
                raise ConfigError(f"the loaded model is quantized as {loaded.quantized}; it cannot serve {quantize}")
            from specdec.models.quant import quantize_model_int8_

            quantize_model_int8_(loaded.model, bits=WEIGHT_BITS[quantize])
            loaded.quantized = quantize
        if loaded.model.device.type == "cpu":
            from specdec.kernels import cpu as cpu_kernels

            # The first use builds the compiled kernels (once per install, about a minute): here, with the
            # load, rather than inside the first request, where it read as a 100-second time to first token.
            cpu_kernels.available()
            move_to_huge_pages(loaded.model)  # before the first forward caches the weights' plan
        self.engine_config = engine_config or EngineConfig()
        self._planners: dict[tuple[str, TreeSpec], SpeculationPlanner] = {}
        self.use(drafter, tree)

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    @property
    def model(self):
        return self.loaded.model

    def use(self, drafter: str = "none", tree: str | None = None) -> None:
        """Switch drafter and tree shape; the target model (and its weights) stay loaded.

        All or nothing: everything new is built first, so a switch that fails leaves the LLM as it was.
        """
        check_drafter_and_tree(drafter, tree, self.engine_config, self.quantize)
        model = self.loaded.model
        check_kv_cache_dtype(model, self.engine_config)
        check_kv_cache_fits(model, self.engine_config)
        # int4 and int7 targets get int8 drafts (a drafter runs few rows, where int7 gains nothing)
        drafts = "int8" if self.quantize in ("int4", "int7") else self.quantize
        ctx = DrafterContext(self.loaded, self.engine_config, model.device, model.dtype, drafts)
        new_drafter = build_drafter(drafter, ctx)
        if model.device.type == "cpu":
            for module in new_drafter.weights():
                move_to_huge_pages(module)
        spec = parse_tree_spec(tree, self.engine_config.max_tree_nodes) if tree else new_drafter.default_tree()
        check_tree_size(spec, self.engine_config, "the tree has")
        # The planner's measurements (step cost, draft cost, acceptance) outlive an engine: switching drafters
        # back and forth, or a new engine config, need not relearn them.
        planner = self._planners.get((drafter, spec)) or SpeculationPlanner()
        engine = Engine(model, self.tokenizer, self.engine_config, new_drafter, spec, planner)
        self._planners[(drafter, spec)] = planner
        self.drafter_spec, self.drafter, self.tree_spec, self.engine = drafter, new_drafter, spec, engine

    # --------------------------------------------------------------------------------------------- prompts
    def encode(self, prompt: Prompt, chat: bool = True) -> list[int]:
        """Token ids for a prompt: token ids pass through; text gets the chat template when the model has one.

        Raises `ConfigError` for anything else: ids outside the vocabulary, text that is not UTF-8, chat
        messages without a role or content.
        """
        if not isinstance(chat, bool):
            raise ConfigError(f"chat must be True or False, got {chat!r}")
        kind = prompt_kind(prompt)
        if kind == "ids":
            check_token_ids(list(prompt), self.loaded.model.config.vocab_size)
            return list(prompt)
        tok = self.tokenizer
        if kind == "messages":
            if not getattr(tok, "chat_template", None):
                raise ConfigError("chat messages need a model with a chat template")
            check_messages(prompt)
            return tok.encode(tok.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False)
        check_text(prompt)
        if chat and getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
            return tok.encode(text, add_special_tokens=False)
        return tok.encode(prompt, add_special_tokens=True)

    def check(self, prompt: Prompt, params: SamplingParams | None = None, chat: bool = True) -> list[int]:
        """The prompt's token ids, after every check `generate` makes before it runs (encoding, context length,
        KV capacity); raises the `SpecdecError` it would raise. Batch callers check each record alone, so one
        bad record does not stop the others."""
        ids = self.encode(prompt, chat)
        self.engine.check_request(ids, params_list(params, 1)[0])
        return ids

    # ------------------------------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        chat: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (continuously batched); outputs come back in prompt order, one per prompt.
        A prompt with `n > 1` samples gets its first sample's output, with every sample in `.samples`."""
        finals: dict[int, dict[int, RequestOutput]] = {}
        for delta in self.stream(prompts, params, chat):
            if delta.finished and delta.output is not None:
                finals.setdefault(delta.index, {})[delta.sample] = delta.output
        outputs = []
        for i in range(len(finals)):
            samples = [finals[i][k] for k in sorted(finals[i])]
            outputs.append(samples[0] if len(samples) == 1 else replace(samples[0], samples=tuple(samples)))
        return outputs

    def stream(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        chat: bool = True,
    ) -> Iterator[StreamDelta]:
        """Yield per-request deltas as the engine produces tokens."""
        prompt_list = prompts_list(prompts)
        param_list = params_list(params, len(prompt_list))
        encoded = [self.encode(p, chat) for p in prompt_list]
        engine = self.engine
        for ids, p in zip(encoded, param_list):  # every request checked before any runs
            engine.check_request(ids, p)
        seqs: list[Sequence] = []
        index: dict[int, int] = {}
        sample: dict[int, int] = {}
        try:
            for i, (ids, p) in enumerate(zip(encoded, param_list)):
                leader = None
                for k, one in enumerate(per_sample(p)):  # n samples: n sequences, the later ones share the prompt's
                    seq = engine.add_request(ids, one, share_prefix_with=leader)  # KV blocks via the prefix cache
                    leader = leader or seq
                    seqs.append(seq)
                    index[seq.seq_id], sample[seq.seq_id] = i, k
            sent_tokens = {seq.seq_id: 0 for seq in seqs}
            sent_chars = {seq.seq_id: 0 for seq in seqs}
            engine.arrivals_closed = True  # every request is in: the planner may plan for the batch's end
            while engine.has_unfinished():
                for seq in engine.step():
                    first = sent_tokens[seq.seq_id]
                    new_ids = seq.output_ids[first:]
                    source_of = seq.metrics.source_of
                    sources = tuple(source_of.get(i, "") for i in range(first, first + len(new_ids))) if source_of else ()
                    sent_tokens[seq.seq_id] = len(seq.output_ids)
                    text = engine.output_text(seq)  # decodes only the new tokens
                    delta_text = text[sent_chars[seq.seq_id]:]
                    sent_chars[seq.seq_id] = len(text)
                    output = self._output(seq, sample[seq.seq_id]) if seq.is_finished else None
                    yield StreamDelta(index[seq.seq_id], delta_text, new_ids, len(new_ids), seq.is_finished, output,
                                      sources, sample[seq.seq_id])
        finally:
            engine.arrivals_closed = False
            for seq in seqs:  # an abandoned stream must not leave requests holding KV blocks
                if not seq.is_finished:
                    engine.abort(seq.seq_id)

    def _output(self, seq: Sequence, sample: int = 0) -> RequestOutput:
        return output_of(seq, self.engine.output_text(seq), time.perf_counter(), sample, self.engine.token_text)


def default_cpu_threads() -> int:
    """Intra-op threads for CPU inference: all cores but one.

    Every op of a decode step is small, and each OpenMP parallel region waits for all its threads. When another
    process holds a core, that wait is a scheduler time slice: on a 2-core machine we measured plain decode at
    18.6 tok/s with 1 thread and 1.3 tok/s with 2 while one other process ran. Leaving one core free keeps
    speed steady on shared machines; `num_threads=` (CLI `--threads`) overrides it.
    """
    return max(1, min(torch.get_num_threads(), (os.cpu_count() or 1) - 1))
