"""bench/plain_decode.py picks the prompts it says it runs."""

from __future__ import annotations

from bench.plain_decode import spread
from specdec.data import bench_prompts


def test_spread_picks_n_distinct_prompts_across_the_whole_split():
    prompts = [p["prompt"] for p in bench_prompts(split="dev")]
    for n in (1, 2, 3, 7, len(prompts)):
        chosen = spread(prompts, n)
        assert len(chosen) == n and len(set(chosen)) == n
    categories = {p["category"] for p in bench_prompts(split="dev") if p["prompt"] in spread(prompts, 7)}
    assert len(categories) == 7, "seven prompts should come from the seven categories"
    assert spread(prompts, 10 * len(prompts)) == prompts
