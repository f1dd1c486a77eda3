"""The `end_to_end` section of bench/gpu_check.py: one target step of the real engine on a real model shape.

A one-token decode step against a 64-node tree verification step, both through `ModelRunner.run` (metadata
build, host-to-device copies, the model, the kernels: everything a step pays), batch 1, random weights of
`dummy:llama-3-8b` in bf16 (tiny: `dummy:tiny-llama` in fp32 on CPU). The ratio is what speculation has to
beat: a tree step that costs 1.3x a decode step pays off once more than 1.3 tokens are accepted per step.
"""

from __future__ import annotations

import random


def end_to_end(setup, rows: list[dict]) -> list[dict]:
    from bench.gpu_check import median_ms
    from specdec.kvcache import BlockTable
    from specdec.models.loader import load_model
    from specdec.engine.runner import Chunk, ModelRunner
    from specdec.tree.token_tree import TokenTree

    tiny = setup.shapes.tiny
    name, dtype, context, nodes = ("dummy:tiny-llama", "float32", 64, 64) if tiny else \
        ("dummy:llama-3-8b", "bfloat16", 1024, 64)
    loaded = load_model(name, setup.device, dtype, show_progress=False)
    vocab = loaded.model.config.vocab_size
    runner = ModelRunner.create(loaded.model, num_blocks=(context + 2 * nodes) // 16 + 8, block_size=16)
    rng = random.Random(0)
    table = BlockTable()
    prompt = [rng.randrange(vocab) for _ in range(context)]
    runner.run([Chunk(table, prompt, list(range(context)), None, "none")])
    parents = [-1] + [rng.randrange(i) for i in range(1, nodes)]
    tree = TokenTree.from_parents([rng.randrange(vocab) for _ in range(nodes)], parents)
    positions = tree.positions(context).tolist()

    def decode() -> None:
        runner.run([Chunk(table, [prompt[-1]], [context], None, "all")])
        runner.cache.truncate(table, context)

    def verify() -> None:
        runner.run([Chunk(table, tree.tokens.tolist(), positions, tree.ancestor_mask, "all")])
        runner.cache.truncate(table, context)

    decode_ms, verify_ms = median_ms(decode, setup), median_ms(verify, setup)
    del runner, loaded
    return [{"section": "end_to_end", "case": f"{name} {dtype} batch 1, context {context}",
             "decode_ms": decode_ms, f"verify{nodes}_ms": verify_ms, "ratio": verify_ms / decode_ms,
             "goal": "ratio <= 1.3"}]
