"""A warm recycle matrix on disk: saved rows come back exactly (pair rows re-hashed for any table size), a file
of another tokenizer or a broken file is one clear error, `reset()` returns to the warm start, and
`specdec data recycle` writes a file the drafter reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.api import LLM
from specdec.drafters.recycle import RecycleDrafter
from specdec.drafters.recycle_matrix import UNSEEN, AdjacencyMatrix
from specdec.drafters.recycle_store import load_matrix, save_matrix, shipped_matrix
from specdec.errors import ConfigError
from specdec.models.loader import load_model
from specdec.training.corpus_store import tokenizer_fingerprint
from tests.cli.runner import assert_user_error, run_cli

VOCAB = 500
PRINT = "fingerprint-a"


def learned(pair_bits: int = 10, k: int = 6, writes: int = 300, seed: int = 0) -> AdjacencyMatrix:
    """A matrix after `writes` random verified rows, pair rows included."""
    gen = torch.Generator().manual_seed(seed)
    matrix = AdjacencyMatrix(VOCAB, k, pair_bits)
    tokens = torch.randint(0, VOCAB, (writes,), generator=gen)
    prev = torch.randint(-1, VOCAB, (writes,), generator=gen)
    matrix.update(tokens, torch.randn(writes, VOCAB, generator=gen) * 3, prev)
    return matrix


def successors(matrix: AdjacencyMatrix, prev: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    return matrix.rows(prev.astype(np.int64), tokens.astype(np.int64))[0]


def test_saved_rows_load_back_exactly(tmp_path):
    source = learned()
    path = tmp_path / "m.npz"
    save_matrix(source, path, PRINT, {"target": "test"})
    copy = AdjacencyMatrix(VOCAB, source.k, source.pair_bits)
    meta = load_matrix(copy, path, PRINT)
    assert meta["target"] == "test" and meta["vocab_size"] == VOCAB
    np.testing.assert_array_equal(copy.table, source.table)
    np.testing.assert_array_equal(copy.pair_keys, source.pair_keys)
    np.testing.assert_array_equal(copy.pair_table, source.pair_table)
    np.testing.assert_allclose(copy.probs, source.probs, rtol=1e-3, atol=1e-4)  # stored as float16
    np.testing.assert_allclose(copy.pair_probs, source.pair_probs, rtol=1e-3, atol=1e-4)


def test_another_pair_table_size_and_a_smaller_k_read_the_same_successors(tmp_path):
    source = learned(pair_bits=10, k=6)
    path = tmp_path / "m.npz"
    save_matrix(source, path, PRINT)
    small = AdjacencyMatrix(VOCAB, 4, pair_bits=14)  # more slots: no two saved keys collide here
    load_matrix(small, path, PRINT)
    keys = source.pair_keys[source.pair_keys >= 0]
    prev, tokens = keys // VOCAB, keys % VOCAB
    np.testing.assert_array_equal(successors(small, prev, tokens), successors(source, prev, tokens)[:, :4])
    alone = np.flatnonzero(source.table[:, 0] != UNSEEN)
    np.testing.assert_array_equal(small.table[alone], source.table[alone, :4])
    assert (small.table[np.setdiff1d(np.arange(VOCAB), alone)] == UNSEEN).all()


def test_a_matrix_of_another_tokenizer_or_vocabulary_is_refused(tmp_path):
    path = tmp_path / "m.npz"
    save_matrix(learned(), path, PRINT)
    with pytest.raises(ConfigError, match="another tokenizer"):
        load_matrix(AdjacencyMatrix(VOCAB, 6, 10), path, "fingerprint-b")
    with pytest.raises(ConfigError, match="another tokenizer"):
        load_matrix(AdjacencyMatrix(VOCAB + 1, 6, 10), path, PRINT)


def test_a_missing_or_broken_file_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_matrix(AdjacencyMatrix(VOCAB, 6), tmp_path / "none.npz", PRINT)
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="not readable"):
        load_matrix(AdjacencyMatrix(VOCAB, 6), broken, PRINT)
    partial = tmp_path / "partial.npz"
    np.savez(partial, rows=np.zeros(1, np.int32))
    with pytest.raises(ConfigError, match="metadata"):
        load_matrix(AdjacencyMatrix(VOCAB, 6), partial, PRINT)


def test_reset_returns_to_the_warm_start_and_forgets_what_came_after(tmp_path):
    path = tmp_path / "m.npz"
    save_matrix(learned(k=8, pair_bits=16), path, PRINT)
    drafter = RecycleDrafter(VOCAB, k=8)
    drafter.warm_from(path, PRINT)
    start = drafter.matrix.table.copy()
    unseen = int(np.flatnonzero(start[:, 0] == UNSEEN)[0])
    drafter.matrix.update(torch.tensor([unseen]), torch.randn(1, VOCAB))
    assert drafter.matrix.table[unseen, 0] != UNSEEN
    drafter.reset()
    np.testing.assert_array_equal(drafter.matrix.table, start)
    cold = RecycleDrafter(VOCAB, k=8)
    cold.matrix.update(torch.tensor([3]), torch.randn(1, VOCAB))
    cold.reset()
    assert (cold.matrix.table == UNSEEN).all()


def test_a_missing_warm_file_fails_before_any_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        LLM("dummy:tiny-llama", drafter=f"recycle:warm={tmp_path / 'none.npz'}")


def test_data_recycle_writes_a_matrix_the_drafter_starts_from(tmp_path):
    out = tmp_path / "tiny.npz"
    result = run_cli("data", "recycle", "--target", "dummy:tiny-llama", "--out", str(out), "--quantize", "none",
                     "--new-tokens", "6", "--concurrency", "4", "--target-tokens", "20")
    assert result.returncode == 0, result.stderr
    assert "rows" in result.stdout and out.is_file()
    loaded = load_model("dummy:tiny-llama", show_progress=False)
    llm = LLM.from_loaded(loaded, drafter=f"recycle:warm={out}")
    seen = llm.drafter.matrix.seen()
    assert seen["rows"].shape[0] > 0
    again = AdjacencyMatrix(loaded.model.config.vocab_size, 8, 16)
    load_matrix(again, out, tokenizer_fingerprint(loaded.tokenizer, loaded.model.config.vocab_size))
    np.testing.assert_array_equal(again.table, llm.drafter.matrix.table)
    cold = LLM.from_loaded(loaded, drafter="recycle:warm=none")
    assert cold.drafter.matrix.seen()["rows"].shape[0] == 0


def test_data_recycle_rejects_bad_options(tmp_path):
    assert_user_error(run_cli("data", "recycle", "--out", str(tmp_path / "m.txt")), ".npz")
    assert_user_error(run_cli("data", "recycle", "--out", str(tmp_path / "m.npz"), "--concurrency", "0"),
                      "--concurrency")


def test_the_default_model_starts_from_its_shipped_matrix(default_model):
    path = shipped_matrix("smollm2-135m")
    assert path is not None, "specdec/assets/recycle/smollm2-135m.npz ships with the package"
    warm = LLM.from_loaded(default_model, drafter="recycle")
    assert warm.drafter.warm_source == path and warm.drafter.matrix.seen()["rows"].shape[0] > 1000
    assert LLM.from_loaded(default_model, drafter="recycle:warm=none").drafter.warm_source is None
