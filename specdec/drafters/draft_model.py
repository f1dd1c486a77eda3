"""`draft[:<model>|layers=N][,k=5,vocab=N,quantize=int4|int8,twin=1]`: a small llama-family model drafts for the target.

* `draft:<model>`: any model our loaders read that shares the target's tokenizer, with its own paged cache.
* `draft:layers=N`: an early-exit self-draft: the target's first N layers, final norm and LM head (no extra
  weights at all; its K/V for those layers live in the drafter's own cache).
* `draft`: the default draft for the target: the shipped distilled 2-layer draft for `smollm2-135m`, the
  registered draft model for an alias that names one (`qwen2.5-coder-0.5b` for `qwen2.5-coder-1.5b`), else an
  early-exit self-draft.

Chains and trees are drafted by `ModelDrafter` (model_drafter.py); this file gives it the forward.

State: the drafter's cache holds the sequence's committed tokens. Each `propose` first feeds the tokens the
target accepted since the last step (one varlen forward), then drafts, then truncates its cache back to the
committed length. Accepted tokens are re-fed next step, which on a CPU costs about what one row costs.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor, nn

from specdec.config import EngineConfig
from specdec.drafters.base import DrafterContext
from specdec.drafters.heads.draft_folder import alias_of, is_draft_folder, load_draft_folder, shipped_draft_dir
from specdec.drafters.heads.reduced_vocab import draft_vocab, recorded_draft_ids, recorded_draft_vocab, reduced_from
from specdec.drafters.model_drafter import Feed, ModelDrafter, sampling_options, spare_blocks
from specdec.drafters.registry import int_arg, register, reject_unknown
from specdec.engine.runner import Chunk, ModelRunner, Rows
from specdec.engine.sequence import Sequence
from specdec.errors import ConfigError
from specdec.kernels import cpu as cpu_kernels
from specdec.models.llama import LlamaModel
from specdec.models.loader import load_model
from specdec.models.quant import quantize_drafter_int8_
from specdec.tree.spec import TreeSpec, chain

DEFAULT_EARLY_EXIT_LAYERS = 6
# An int4 draft under an int8 target runs passes of more than 4 rows (its prompt, a long catch-up) on an int8 twin
# of its layers: the int4 tiles pay per row (the 0.5B's linears: 28.6 ms at 1 row, 43.7 at 4, 66.9 at 8, 492 at
# 64), the int8 ones hardly (45.0, 44.5, 44.6, 105 ms on AMX; bench/int8_rows.py --bits 8,4 --rows 1,4,8,64).
TWIN_ROWS = 5
# The shipped distilled draft's defaults (specdec/assets/drafts/<alias>/specdec_draft.json `draft_vocab`, and a
# chain of SHIPPED_DEAR_ROWS_K where verified rows are dear: AVX2, AVX-512 VNNI). On a Zen 4 core, dev split,
# planner on: the full head and `chain:k=5` ran at 0.96x of int8 plain decode, a 4,096-token head 1.02x, and with
# it a chain of 1 1.06x (2: 1.05x); one depth of it was already the only one that paid
# (bench/results/plan_accuracy/draft.md), and a deeper limit let the planner's optimism buy losing depths.
SHIPPED_META = "specdec_draft.json"
SHIPPED_DEAR_ROWS_K = 1


class DraftModelDrafter(ModelDrafter):
    name = "draft"

    def __init__(self, model: LlamaModel, engine: EngineConfig, k: int = 5, num_layers: int | None = None,
                 ids: Tensor | None = None, twin: LlamaModel | None = None) -> None:
        self.k = k
        self.ids = ids  # [N] target id of each draft id, when the model's head is a ReducedHead (vocab=N)
        self.twin = twin  # the same draft with int8 layers, for passes of TWIN_ROWS rows or more (int4 drafts)
        self.runner = ModelRunner.create(model, engine.num_blocks + spare_blocks(engine), engine.block_size,
                                         num_layers)
        self.cache = self.runner.cache

    def default_tree(self) -> TreeSpec:
        return chain(self.k)

    def weights(self) -> list[nn.Module]:
        return [self.runner.model] + ([self.twin] if self.twin is not None else [])

    @property
    def vocab_size(self) -> int:
        return self.runner.model.config.vocab_size

    def _catch_up(self, seqs: list[Sequence]) -> list[Feed]:
        feeds = []
        for seq in seqs:
            table = self.table(seq)
            feeds.append(Feed(table, seq.token_ids[table.length:], list(range(table.length, seq.num_tokens)),
                              outputs=1))
        return feeds

    def _forward(self, feeds: list[Feed]) -> list[Tensor]:
        chunks = [Chunk(f.table, f.tokens, f.positions, f.mask, Rows.ALL if f.outputs is None else Rows.LAST,
                        tail=f.outputs or 1) for f in feeds]
        model = self.runner.model
        if self.twin is not None and max(len(f.tokens) for f in feeds) >= TWIN_ROWS:
            self.runner.model = self.twin  # same config, same cache layout: the K/V it writes serve the int4 model
        try:
            return [out.logits for out in self.runner.run(chunks)]
        finally:
            self.runner.model = model

    def _logits(self, outputs: Tensor) -> tuple[Tensor, Tensor | None]:
        return outputs, self.ids


@register("draft")
def _build(args: dict[str, str], ctx: DrafterContext) -> DraftModelDrafter:
    sampling = sampling_options(args)
    drafter = _build_draft(args, ctx)
    drafter.set_sampling(sampling)
    return drafter


def _build_draft(args: dict[str, str], ctx: DrafterContext) -> DraftModelDrafter:
    k_given, vocab_given = "k" in args, "vocab" in args
    k = int_arg(args, "k", 5)
    vocab = int_arg(args, "vocab", 0, minimum=0)
    layers = args.pop("layers", None)
    model_ref = args.pop("", None)
    quantize = _quantize_option(args.pop("quantize", None), ctx)
    twin = int_arg(args, "twin", 1, minimum=0)  # 0: an int4 draft runs every pass on its int4 layers
    reject_unknown("draft", args)
    target: LlamaModel = ctx.target.model
    if model_ref is not None and layers is not None:
        raise ConfigError("draft option layers= picks an early-exit draft; it cannot go with a draft model "
                          f"('{model_ref}')")
    registered = False
    if model_ref is None and layers is None:
        shipped = shipped_draft_dir(ctx.target.source)
        if shipped is not None:
            _no_quantize_option(quantize, "the shipped draft")
            if not vocab_given:
                vocab = recorded_draft_vocab(shipped, SHIPPED_META)
            if not k_given:
                k = cpu_kernels.by_row_price(SHIPPED_DEAR_ROWS_K, SHIPPED_DEAR_ROWS_K, k, ctx.device)
            return _drafter(_layers_only_draft(shipped, ctx), ctx, k, vocab)
        model_ref = default_draft_model(ctx.target.source)  # qwen2.5-coder-1.5b drafts with its 0.5B sibling
        registered = model_ref is not None
    if model_ref is None:
        _no_quantize_option(quantize, "an early-exit draft")
        n = DEFAULT_EARLY_EXIT_LAYERS if layers is None else _layers(layers, target.config.num_layers)
        if vocab:
            raise ConfigError("draft option vocab= needs a draft with a head of its own (a draft folder or model); "
                              "an early-exit draft shares the target's head")
        return DraftModelDrafter(target, ctx.engine, k=k, num_layers=n)
    if is_draft_folder(model_ref):
        _no_quantize_option(quantize, "a draft folder")
        folder = Path(model_ref).expanduser()
        if not vocab_given:  # the vocabulary it records (`specdec train draft --vocab N` writes it)
            vocab = recorded_draft_vocab(folder, SHIPPED_META)
        trained_ids = recorded_draft_ids(folder, SHIPPED_META, target.config.vocab_size)
        ids = trained_ids if trained_ids is not None and vocab == trained_ids.shape[0] else None
        return _drafter(_layers_only_draft(folder, ctx), ctx, k, vocab, ids)
    precision, lighter_vocab = default_draft_precision(ctx) if registered else (ctx.quantize, 0)
    precision = quantize or precision
    if not vocab_given and precision == "int4":
        vocab = lighter_vocab
    # quantized as it loads (our kernels' QLinear where they are built)
    draft = load_model(model_ref, ctx.device, ctx.dtype, show_progress=True, quantize=precision)
    check_same_tokenizer(ctx.target.tokenizer, draft.tokenizer, model_ref)
    if ctx.quantize == "int8" and draft.quantized is None:  # CUDA or a non-float32 dtype: as before
        quantize_drafter_int8_(draft.model)
    drafter = _drafter(draft.model, ctx, k, vocab)
    if twin and ctx.quantize == "int8" and draft.quantized == "int4":
        drafter.twin = _int8_twin(model_ref, ctx, draft.model)
    return drafter


def _int8_twin(model_ref: str, ctx: DrafterContext, draft: LlamaModel) -> LlamaModel:
    """The int4 draft's layers again at int8, sharing its embedding, final norm and head (TWIN_ROWS): about one
    byte a layer weight more, twice where the kernels keep an AMX copy."""
    from specdec.models.config import ModelConfig
    from specdec.models.loader import resolve_target
    from specdec.models.quantized_load import load_quantized

    folder = resolve_target(model_ref, show_progress=False)
    twin = load_quantized(folder, ModelConfig.from_file(folder / "config.json"), bits=8, layers_only=True)
    twin.embed_tokens, twin.norm, twin.lm_head = draft.embed_tokens, draft.norm, draft.lm_head
    return twin


def _drafter(draft: LlamaModel, ctx: DrafterContext, k: int, vocab: int,
             ids: Tensor | None = None) -> DraftModelDrafter:
    """The drafter, with its head cut to the `vocab` most frequent target tokens when asked, or to `ids` (the
    draft then has a head of its own, int8 with an int8 target; the target's head is never touched)."""
    if not vocab:
        return DraftModelDrafter(draft, ctx.engine, k=k)
    if ids is None:
        ids = draft_vocab(alias_of(ctx.target.source), vocab, draft.config.vocab_size)
    reduced = reduced_from(draft, ids).to(ctx.device, draft.dtype)
    draft.lm_head = reduced
    if ctx.quantize == "int8":
        quantize_drafter_int8_(reduced)
    return DraftModelDrafter(draft, ctx.engine, k=k, ids=reduced.ids)


def default_draft_model(target_source: str) -> str | None:
    """The draft model alias registered for the target (specdec/models/aliases.py), if any."""
    from specdec.models import registry

    alias = alias_of(target_source)
    return registry.default_draft(alias) if alias is not None else None


def _layers_only_draft(folder: Path, ctx: DrafterContext) -> LlamaModel:
    """A draft of decoder layers only (shipped or `specdec train draft`), on the target's embedding and head.

    int8: only the draft's own linears are quantized. Its LM head is the target's module: already int8 when the
    target was quantized (and then left alone), and a float head that `quantize_drafter_int8_` meets is replaced
    in the draft only, by a copy, so the target's head and the shared embedding are never changed.
    """
    draft = load_draft_folder(folder, ctx.target)
    if ctx.quantize == "int8":
        quantize_drafter_int8_(draft)
    return draft


def _layers(raw: str, total: int) -> int:
    try:
        n = int(raw)
    except ValueError:
        raise ConfigError(f"draft option layers must be an integer, got '{raw}'") from None
    if not 1 <= n < total:
        raise ConfigError(f"draft option layers must be between 1 and {total - 1} for this target, got {n}")
    return n


def check_same_tokenizer(target_tok, draft_tok, name: str) -> None:
    """A draft must speak the target's token ids, or every proposal is garbage."""
    same = len(target_tok) == len(draft_tok)
    if same and hasattr(target_tok, "get_vocab") and hasattr(draft_tok, "get_vocab"):
        same = target_tok.get_vocab() == draft_tok.get_vocab()
    if not same:
        raise ConfigError(f"draft model '{name}' does not share the target's tokenizer "
                          f"(vocabularies of {len(draft_tok)} vs {len(target_tok)} tokens differ)")


def _quantize_option(raw: str | None, ctx: DrafterContext) -> str | None:
    if raw is None:
        return None
    if raw not in ("int8", "int4"):
        raise ConfigError(f"draft option quantize must be int8 or int4, got '{raw}'")
    if ctx.quantize is None:
        raise ConfigError("draft option quantize= needs a quantized target (--quantize int8 on CPU)")
    return raw


def _no_quantize_option(quantize: str | None, what: str) -> None:
    if quantize is not None:
        raise ConfigError(f"draft option quantize= sets the precision of a separate draft model; {what} runs at "
                          "the target's")


def default_draft_precision(ctx: DrafterContext) -> tuple[str | None, int]:
    """The precision of a target's registered draft model, and the rows of its head (0: all).

    Where the alias says its draft keeps its acceptance at 4 bits (ModelAlias.draft_int4), under an int8 target,
    and the int4 kernels run on AVX-512 VNNI: int4 layers and a head cut to the alias's `draft_vocab` most
    frequent tokens (a 4-bit draft token streams 0.6x the layers' bytes, and the full 151,936-row head would be
    a third of what is left). Else the target's own precision (int8 for int4/int7 targets) and the full head."""
    from specdec.kernels import cpu
    from specdec.models import registry

    alias = alias_of(ctx.target.source)
    lighter = registry.lighter_draft(alias) if alias is not None else None
    if ctx.quantize == "int8" and lighter is not None and cpu.available() and cpu.isa() in ("avx512", "amx"):
        return "int4", lighter
    return ctx.quantize, 0
