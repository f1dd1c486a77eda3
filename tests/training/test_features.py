"""Recorded training features equal what the engine's paged forward gives a feature drafter."""

import torch

from specdec.kvcache import BlockTable
from specdec.engine.runner import Chunk, ModelRunner, Rows
from specdec.training.common import Corpus
from specdec.training.features import record_features
from tests.helpers import tiny_model


def test_features_match_the_paged_forward():
    model = tiny_model(seed=3, vocab=32)
    gen = torch.Generator().manual_seed(0)
    corpus = Corpus(prompt_ids=[torch.randint(0, 32, (n,), generator=gen).tolist() for n in (5, 9, 3)],
                    response_ids=[torch.randint(0, 32, (n,), generator=gen).tolist() for n in (4, 2, 7)])
    feats = record_features(model, corpus, capture_layers=(0, 1), batch_tokens=24)
    assert [f.shape[0] for f in feats.hidden] == [9, 11, 10]
    for i in range(3):
        ids = corpus.prompt_ids[i] + corpus.response_ids[i]
        final = ModelRunner.create(model, 16, 4).run([Chunk(BlockTable(), ids, list(range(len(ids))), None, Rows.NONE)], return_hidden=True)[0].hidden
        captured = ModelRunner.create(model, 16, 4).run(
            [Chunk(BlockTable(), ids, list(range(len(ids))), None, Rows.NONE)], return_hidden=True, capture_layers=(0, 1))[0].hidden
        torch.testing.assert_close(feats.hidden[i].float(), final, atol=2e-2, rtol=2e-2)
        both = torch.cat([feats.layers[0][i], feats.layers[1][i]], dim=-1).float()
        torch.testing.assert_close(both, captured, atol=2e-2, rtol=2e-2)
