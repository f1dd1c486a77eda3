"""Stopping and output text: the incremental detokenizer gives the text a full decode gives, at every step;
half a character waits for the rest; a stop string split across steps is found and the text cut there (and,
while running, the text that might start one is held back); EOS, length and ignore_eos; nothing is kept after
a stop; and a speculative step that runs past a stop string ends where plain decoding would.

Two tokenizers: the byte tokenizer (one token per UTF-8 byte, so every multi-byte character is split), and the
default model's own byte-level BPE (read straight from its tokenizer.json when the model is in the cache).
"""

from __future__ import annotations

import random

import pytest

from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.none import NoDrafter
from specdec.engine.stopping import StopRules, TextState
from specdec.models.tokenizer import ByteTokenizer
from specdec.tree.spec import chain
from tests.helpers import NoTokenizer, run_all, skip_unless_ci, tiny_engine, tiny_model

BYTES = ByteTokenizer(260)
EOS = 1  # the byte tokenizer leaves ids 0..3 for special tokens
TEXT = "Grüße, 世界! 😀 naïve café: ok.\nDone"


@pytest.fixture(scope="module")
def bpe():
    """The default model's tokenizer (a byte-level BPE), loaded without transformers: 0.5 s instead of ~10 s."""
    from tokenizers import Tokenizer

    from specdec.errors import OfflineError
    from specdec.models.registry import DEFAULT_MODEL, cache_root, resolve_alias

    path = cache_root() / "models" / DEFAULT_MODEL / "tokenizer.json"
    if not path.is_file():
        try:
            path = resolve_alias(DEFAULT_MODEL, show_progress=False) / "tokenizer.json"  # fetched once per machine
        except OfflineError as exc:
            skip_unless_ci(f"default model unavailable offline: {exc}")
    return Tokenizer.from_file(str(path))


def encode(tokenizer, text: str) -> list[int]:
    return BYTES.encode(text) if tokenizer is BYTES else tokenizer.encode(text, add_special_tokens=False).ids


def rules(tokenizer, max_len: int = 10_000) -> StopRules:
    return StopRules(tokenizer, frozenset({EOS}), max_len)


def split(ids: list[int], seed: int) -> list[list[int]]:
    """Random step sizes (1 to 4 tokens), as speculative steps emit them."""
    rng = random.Random(seed)
    steps, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 4)
        steps.append(ids[i: i + n])
        i += n
    return steps


def check_against_full_decode(tokenizer, ids_steps: list[list[int]]) -> TextState:
    stops, state, output = rules(tokenizer), TextState(), []
    for tokens in ids_steps:
        output += tokens
        new = stops.decode(state, output)
        full = tokenizer.decode(output, skip_special_tokens=True)
        assert state.text == tokenizer.decode(output[: state.read_offset], skip_special_tokens=True)
        assert full.startswith(state.text) and state.text.endswith(new)
        assert "\ufffd" not in state.text[-1:], "half a character was let through"
        if not full.endswith("\ufffd"):
            assert state.text == full
    stops.finish(state, output)
    assert state.text == tokenizer.decode(output, skip_special_tokens=True)
    return state


# ------------------------------------------------------------------------------------------ detokenizer
@pytest.mark.parametrize("seed", range(4))
def test_incremental_text_equals_a_full_decode_at_every_step_bytes(seed):
    check_against_full_decode(BYTES, split(BYTES.encode(TEXT), seed))


@pytest.mark.parametrize("seed", range(4))
def test_incremental_text_equals_a_full_decode_when_pieces_depend_on_their_neighbours(seed):
    """A tokenizer whose text for a token depends on the token before it (here: ids joined by spaces, as
    SentencePiece drops a leading space at the start of a text): the window keeps that context."""
    check_against_full_decode(NoTokenizer(), split(list(range(10, 40)), seed))


@pytest.mark.parametrize("seed", range(4))
def test_incremental_text_equals_a_full_decode_at_every_step_bpe(bpe, seed):
    ids = encode(bpe, TEXT)
    assert any("\ufffd" in bpe.decode([i]) for i in ids), "the text was meant to split characters across tokens"
    check_against_full_decode(bpe, split(ids, seed))


def test_incremental_text_equals_a_full_decode_on_random_bpe_ids(bpe):
    """Random ids are mostly fragments: broken characters, orphan continuation bytes, special tokens."""
    rng = random.Random(0)
    vocab = bpe.get_vocab_size()
    for seed in range(20):
        check_against_full_decode(bpe, split([rng.randrange(vocab) for _ in range(40)], seed))


def test_a_split_character_is_held_back_until_complete():
    stops, state, output = rules(BYTES), TextState(), []
    first, second, third = BYTES.encode("日")  # one character, three bytes, three tokens
    for token, want in [(BYTES.encode("a")[0], "a"), (first, "a"), (second, "a"), (third, "a日")]:
        output.append(token)
        stops.decode(state, output)
        assert state.text == want
        assert state.visible((), finished=False) == want


def test_a_request_ending_inside_a_character_shows_the_replacement_at_the_end():
    stops, state = rules(BYTES), TextState()
    output = BYTES.encode("ok")
    stops.decode(state, output)
    output += BYTES.encode("日")[:2]
    stops.decode(state, output)
    assert state.text == "ok"
    stops.finish(state, output)
    assert state.text == BYTES.decode(output) == "ok\ufffd"


def test_a_split_bpe_character_is_held_back(bpe):
    ids = encode(bpe, "hi 😀")
    pieces = [bpe.decode([i]) for i in ids]
    assert pieces[-1] == "\ufffd" and pieces[-2].endswith("\ufffd")  # the emoji's bytes span two tokens
    stops, state = rules(bpe), TextState()
    for n in range(1, len(ids)):
        stops.decode(state, ids[:n])
    assert state.text == "hi"  # the space waits with the half character
    stops.decode(state, ids)
    assert state.text == "hi 😀"


# ------------------------------------------------------------------------------------------ stop strings
def run_steps(tokenizer, steps: list[list[int]], params: SamplingParams):
    """Feed `steps` through `StopRules.append` as the engine does; returns (state, output, reasons, kept)."""
    stops, state, output, reasons, kept = rules(tokenizer), TextState(), [], [], []
    for tokens in steps:
        n, reason = stops.append(state, output, tokens, params, prompt_len=3)
        kept.append(n)
        reasons.append(reason)
        if reason is not None:
            stops.finish(state, output)
            break
    return state, output, reasons, kept


def test_a_stop_string_split_across_steps_is_found_and_cuts_the_text():
    params = SamplingParams(stop=("STOP",), ignore_eos=True)
    steps = [BYTES.encode(s) for s in ["hello S", "TO", "P", " world"]]
    state, output, reasons, _ = run_steps(BYTES, steps, params)
    assert reasons == [None, None, "stop"]
    assert state.end == len("hello ") and state.visible(params.stop, finished=True) == "hello "
    assert BYTES.decode(output) == "hello STOP"


def test_while_running_the_text_that_may_start_a_stop_string_is_held_back():
    params = SamplingParams(stop=("STOP", "##"), ignore_eos=True)
    stops, state, output = rules(BYTES), TextState(), []
    shown = []
    for piece in ["hello", " S", "TOP"]:
        stops.append(state, output, BYTES.encode(piece), params, prompt_len=3)
        shown.append(state.visible(params.stop, finished=False))
    # the longest stop has 4 characters: the last 3 may be its start; once it is found, the text is cut
    assert shown == ["he", "hell", "hello "]
    assert TextState(text="hello S").visible((), finished=False) == "hello S"  # no stop strings: nothing held


def test_the_earliest_of_several_stop_strings_wins():
    params = SamplingParams(stop=("world", "lo w"), ignore_eos=True)
    state, _, reasons, _ = run_steps(BYTES, [BYTES.encode("hello world!")], params)
    assert reasons == ["stop"] and state.visible(params.stop, True) == "hel"


def test_a_stop_string_across_bpe_tokens_is_found(bpe):
    text = "The answer is 42.\nUser: and now?"
    ids = encode(bpe, text)
    params = SamplingParams(stop=("\nUser:",), ignore_eos=True)
    state, output, reasons, _ = run_steps(bpe, [[i] for i in ids], params)
    assert reasons[-1] == "stop" and len(reasons) < len(ids)
    assert state.visible(params.stop, finished=True) == "The answer is 42."
    assert bpe.decode(output).endswith("User:")  # the last token kept is the one that completed the stop


def test_tokens_after_a_stop_string_are_not_kept():
    """A speculative step may accept tokens past the one that completes a stop string; plain decoding would
    have stopped there, so those tokens are dropped."""
    params = SamplingParams(stop=("ab",), ignore_eos=True)
    state, output, reasons, kept = run_steps(BYTES, [BYTES.encode("x"), BYTES.encode("aby z")], params)
    assert reasons == [None, "stop"] and kept == [1, 2]
    assert BYTES.decode(output) == "xab"
    assert state.visible(params.stop, True) == "x"


# ----------------------------------------------------------------------------------------------- reasons
def test_eos_stops_and_drops_what_follows_it():
    _, output, reasons, kept = run_steps(BYTES, [[10, 11], [12, EOS, 13, 14]], SamplingParams())
    assert output == [10, 11, 12, EOS] and reasons == [None, "stop"] and kept == [2, 2]


def test_ignore_eos_runs_through_it():
    _, output, reasons, kept = run_steps(BYTES, [[10, EOS, 11]], SamplingParams(ignore_eos=True))
    assert output == [10, EOS, 11] and reasons == [None] and kept == [3]


def test_length_stops_at_max_new_tokens():
    _, output, reasons, kept = run_steps(BYTES, [[10, 11], [12, 13, 14]], SamplingParams(max_new_tokens=3))
    assert output == [10, 11, 12] and reasons == [None, "length"] and kept == [2, 1]


def test_length_stops_at_the_models_context():
    stops, state, output = StopRules(BYTES, frozenset({EOS}), max_len=6), TextState(), []
    kept, reason = stops.append(state, output, [10, 11, 12, 13], SamplingParams(), prompt_len=4)
    assert (kept, reason, output) == (2, "length", [10, 11])


def test_eos_text_is_not_shown():
    state, output, _, _ = run_steps(BYTES, [BYTES.encode("hi") + [EOS]], SamplingParams(stop=("zz",)))
    assert output[-1] == EOS and state.visible(("zz",), finished=True) == "hi"


# ------------------------------------------------------------------------------------------------ engine
def test_speculative_output_with_a_stop_string_is_plain_decodings():
    """The target drafting for itself gets every draft accepted, so steps emit five tokens and run past the
    stop string: the output (tokens, text, reason) and the tokens counted per step are plain decoding's."""
    model = tiny_model(seed=11, vocab=64, sharpness=0.5)
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    free = tiny_engine(model, NoDrafter(), chain(0), kv_cache_tokens=512, block_size=4)
    free_seq = free.add_request([1, 2, 3], params)
    run_all(free)
    stop = " ".join(map(str, free_seq.output_ids[5:7]))  # the helpers' tokenizer joins ids with spaces
    params = SamplingParams(max_new_tokens=30, ignore_eos=True, stop=(stop,))

    def run(drafter, tree):
        engine = tiny_engine(model, drafter, tree, kv_cache_tokens=512, block_size=4, adaptive_speculation=False)
        seq = engine.add_request([1, 2, 3], params)
        run_all(engine)
        return seq, engine.output_text(seq)

    plain, plain_text = run(NoDrafter(), chain(0))
    spec, spec_text = run(DraftModelDrafter(model, EngineConfig(kv_cache_tokens=512, block_size=4), k=4), chain(4))
    assert plain.finish_reason == spec.finish_reason == "stop"
    assert spec.output_ids == plain.output_ids == free_seq.output_ids[:7]
    assert spec_text == plain_text and stop not in spec_text
    assert max(spec.metrics.step_accepts) == 5  # the steps did run past the stop
    assert sum(spec.metrics.step_accepts) == len(spec.output_ids) - 1  # tau counts the kept tokens only


def test_a_stop_token_id_ends_the_request_like_eos_and_is_kept():
    r, state, out = rules(BYTES), TextState(), []
    params = SamplingParams(stop_token_ids=[BYTES.encode("x")[0]])
    kept, reason = r.append(state, out, BYTES.encode("abxcd"), params, prompt_len=1)
    assert (kept, reason) == (3, "stop") and out == BYTES.encode("abx")


def test_min_new_tokens_ignores_eos_stop_tokens_and_stop_strings_before_the_minimum():
    r, state, out = rules(BYTES), TextState(), []
    params = SamplingParams(stop=("b", "cd"), stop_token_ids=[BYTES.encode("a")[0]], min_new_tokens=3)
    tokens = BYTES.encode("ab") + [EOS] + BYTES.encode("bcd")
    kept, reason = r.append(state, out, tokens, params, prompt_len=1)
    # a, b and EOS are the first three tokens: none of them stops; the next b does
    assert (kept, reason) == (4, "stop")
    assert state.visible(params.stop, True) == "ab"  # the text up to the stop string that ended it


def test_a_stop_string_straddling_the_minimum_counts():
    r, state, out = rules(BYTES), TextState(), []
    params = SamplingParams(stop=("bc",), min_new_tokens=2)
    kept, reason = r.append(state, out, BYTES.encode("abcd"), params, prompt_len=1)
    assert (kept, reason) == (3, "stop") and state.visible(params.stop, True) == "a"
