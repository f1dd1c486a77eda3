"""The library API: `LLM(...)`, `LLM.generate(...)`, `LLM.stream(...)`.

Shaped like vLLM's offline API so that users can switch with little effort, with speculative decoding as a
constructor argument (`drafter=`, `tree=`) rather than a separate class.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence as Seq

import torch

from specdec.adaptive import SpeculationPlanner
from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.base import DrafterContext
from specdec.drafters.registry import build_drafter
from specdec.engine import Engine
from specdec.errors import ConfigError
from specdec.models.loader import LoadedModel, load_model
from specdec.outputs import RequestOutput, metrics_of
from specdec.sequence import Sequence
from specdec.tree_spec import TreeSpec, parse_tree_spec

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
        if num_threads is None and str(device).startswith("cpu"):
            num_threads = default_cpu_threads()
        if num_threads:
            torch.set_num_threads(num_threads)
        loaded = load_model(target, device, dtype, show_progress=show_progress)
        self._setup(loaded, target, drafter, tree, quantize, engine_config)

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, drafter: str = "none", tree: str | None = None,
                    quantize: str | None = None, engine_config: EngineConfig | None = None) -> "LLM":
        """An LLM around a model already in memory (tests, benches comparing drafters on one model)."""
        llm = cls.__new__(cls)
        llm._setup(loaded, loaded.source, drafter, tree, quantize, engine_config)
        return llm

    def _setup(self, loaded: LoadedModel, target: str, drafter: str, tree: str | None, quantize: str | None,
               engine_config: EngineConfig | None) -> None:
        self.loaded = loaded
        self.target = target
        self.quantize = quantize
        if quantize not in (None, "none", "int8", "int4"):
            raise ConfigError(f"unknown quantization '{quantize}'; choose int8, int4 or none")
        if quantize == "none":
            quantize = self.quantize = None
        if loaded.quantized != quantize:
            if quantize not in ("int8", "int4") or loaded.quantized is not None:
                raise ConfigError(f"the loaded model is quantized as {loaded.quantized}; it cannot serve {quantize}")
            from specdec.models.quant import quantize_model_int8_

            quantize_model_int8_(loaded.model, bits=4 if quantize == "int4" else 8)
            loaded.quantized = quantize
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
        """Switch drafter and tree shape; the target model (and its weights) stay loaded."""
        model = self.loaded.model
        drafts = "int8" if self.quantize == "int4" else self.quantize  # int4 targets get int8 drafts
        ctx = DrafterContext(self.loaded, self.engine_config, model.device, model.dtype, drafts)
        self.drafter_spec = drafter
        self.drafter = build_drafter(drafter, ctx)
        spec = parse_tree_spec(tree, self.engine_config.max_tree_nodes) if tree else self.drafter.default_tree()
        if spec.max_nodes > self.engine_config.max_tree_nodes:
            raise ConfigError(f"the tree has {spec.max_nodes} nodes, more than max_tree_nodes="
                              f"{self.engine_config.max_tree_nodes}")
        self.tree_spec = spec
        # The planner's measurements (step cost, draft cost, acceptance) outlive an engine: switching drafters
        # back and forth, or a new engine config, need not relearn them.
        planner = self._planners.setdefault((drafter, spec), SpeculationPlanner())
        self.engine = Engine(model, self.tokenizer, self.engine_config, self.drafter, spec, planner)

    # --------------------------------------------------------------------------------------------- prompts
    def encode(self, prompt: Prompt, chat: bool = True) -> list[int]:
        """Token ids for a prompt: token ids pass through; text gets the chat template when the model has one."""
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        tok = self.tokenizer
        if isinstance(prompt, list):  # chat messages
            if not getattr(tok, "chat_template", None):
                raise ConfigError("chat messages need a model with a chat template")
            return tok.encode(tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False)
        if not isinstance(prompt, str):
            raise ConfigError(f"a prompt must be text, token ids or chat messages, got {type(prompt).__name__}")
        if chat and getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
            return tok.encode(text, add_special_tokens=False)
        return tok.encode(prompt, add_special_tokens=True)

    # ------------------------------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        chat: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (continuously batched); outputs come back in prompt order."""
        finals: dict[int, RequestOutput] = {}
        for delta in self.stream(prompts, params, chat):
            if delta.finished and delta.output is not None:
                finals[delta.index] = delta.output
        return [finals[i] for i in range(len(finals))]

    def stream(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        chat: bool = True,
    ) -> Iterator[StreamDelta]:
        """Yield per-request deltas as the engine produces tokens."""
        prompt_list = _as_list(prompts)
        param_list = _params_list(params, len(prompt_list))
        encoded = [self.encode(p, chat) for p in prompt_list]
        engine = self.engine
        seqs: list[Sequence] = []
        try:
            for ids, p in zip(encoded, param_list):
                seqs.append(engine.add_request(ids, p))
            index = {seq.seq_id: i for i, seq in enumerate(seqs)}
            sent_tokens = {seq.seq_id: 0 for seq in seqs}
            sent_text = {seq.seq_id: "" for seq in seqs}
            while engine.has_unfinished():
                for seq in engine.step():
                    new_ids = seq.output_ids[sent_tokens[seq.seq_id]:]
                    sent_tokens[seq.seq_id] = len(seq.output_ids)
                    text = engine.output_text(seq)
                    delta_text = text[len(sent_text[seq.seq_id]):] if text.startswith(sent_text[seq.seq_id]) else ""
                    if seq.is_finished or not text.endswith("\ufffd"):  # hold back half a multi-byte character
                        sent_text[seq.seq_id] = text
                    else:
                        delta_text = ""
                    output = self._output(seq) if seq.is_finished else None
                    yield StreamDelta(index[seq.seq_id], delta_text, new_ids, len(new_ids), seq.is_finished, output)
        finally:
            for seq in seqs:  # an abandoned stream must not leave requests holding KV blocks
                if not seq.is_finished:
                    engine.abort(seq.seq_id)

    def _output(self, seq: Sequence) -> RequestOutput:
        return RequestOutput(
            request_id=seq.seq_id,
            prompt_token_ids=list(seq.prompt_ids),
            text=self.engine.output_text(seq),
            token_ids=list(seq.output_ids),
            finish_reason=seq.finish_reason,
            metrics=metrics_of(seq, time.perf_counter()),
        )


def default_cpu_threads() -> int:
    """Intra-op threads for CPU inference: all cores but one.

    Every op of a decode step is small, and each OpenMP parallel region waits for all its threads. When another
    process holds a core, that wait is a scheduler time slice: on a 2-core machine we measured plain decode at
    18.6 tok/s with 1 thread and 1.3 tok/s with 2 while one other process ran. Leaving one core free keeps
    speed steady on shared machines; `num_threads=` (CLI `--threads`) overrides it.
    """
    return max(1, min(torch.get_num_threads(), (os.cpu_count() or 1) - 1))


def _as_list(prompts: Any) -> list:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]  # one prompt of token ids
    if isinstance(prompts, list) and prompts and all(isinstance(m, dict) for m in prompts):
        return [prompts]  # one chat conversation
    prompts = list(prompts)
    if not prompts:
        raise ConfigError("no prompts given")
    return prompts


def _params_list(params: Any, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ConfigError(f"got {len(params)} sampling params for {n} prompts")
    return params
