"""`specdec bench` (bench/suite.py): the --quick path runs end to end through the CLI and its reports agree
with themselves; the transformers assistant is the same network as our shipped draft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specdec.benchmarks.report import HF_PLAIN, PLAIN
from specdec.benchmarks.suite import QUICK, resolve_options
from specdec.cli.app import app
from specdec.errors import ConfigError


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, default_model) -> tuple[dict, str, Path]:
    """--quick on two categories (a multi-turn one and short questions) at 8 tokens, to keep CI short."""
    out = tmp_path_factory.mktemp("suite")
    result = CliRunner().invoke(app, ["bench", "--quick", "--categories", "conversation,qa", "--max-new-tokens", "8",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return json.loads((out / "suite.json").read_text()), (out / "suite.md").read_text(), out


def test_quick_bench_writes_every_report(quick_run) -> None:
    data, _, out = quick_run
    for name in ("suite.json", "suite.md", "speedup.png", "acceptance.png"):
        assert (out / name).stat().st_size > 0, name
    assert [m["key"] for m in data["methods"]] == [PLAIN, "specdec:ngram", HF_PLAIN, "hf:prompt-lookup"]
    assert data["settings"]["max_new_tokens"] == 8 and data["settings"]["prompts_per_category"] == 1
    assert "specdec bench" in data["command"] and "--max-new-tokens 8" in data["command"]


def test_quick_bench_tables_have_a_row_per_method(quick_run) -> None:
    data, text, _ = quick_run
    tables = [block for block in text.split("\n\n") if block.startswith("| Method")]
    assert len(tables) == 2  # over our plain decode, over transformers generate
    for table in tables:
        rows = table.splitlines()[2:]
        assert [row.split(" | ")[0].lstrip("| ") for row in rows] == [m["label"] for m in data["methods"]]
        assert all(row.count("|") == table.splitlines()[0].count("|") for row in rows)


def test_quick_bench_speedups_are_ratios_of_recorded_speeds(quick_run) -> None:
    data, _, _ = quick_run
    rows = {(r["method"], r["category"]): r for r in data["rows"]}
    for (method, category), row in rows.items():
        assert row["tok_s"] == pytest.approx(row["tokens"] / row["seconds"])
        assert row["speedup_vs_plain"] == pytest.approx(row["tok_s"] / rows[(PLAIN, category)]["tok_s"])
        assert row["speedup_vs_hf"] == pytest.approx(row["tok_s"] / rows[(HF_PLAIN, category)]["tok_s"])
    for method in {m for m, _ in rows}:
        parts = [r for (m, c), r in rows.items() if m == method and c != "overall"]
        assert rows[(method, "overall")]["tokens"] == sum(r["tokens"] for r in parts)
        assert rows[(method, "overall")]["seconds"] == pytest.approx(sum(r["seconds"] for r in parts))
    runs = data["runs"]
    assert len(runs) == 2 * len(data["methods"])  # one prompt per category, every method on each
    conversation = [r for r in runs if r["category"] == "conversation"]
    assert all(r["tokens"] > 8 for r in conversation)  # both turns counted (8 new tokens each at most)


def test_quick_bench_plain_decodes_agree(quick_run) -> None:
    """Greedy fp32: our plain decode is tau 1 and transformers' generate produces the very same tokens."""
    data, _, _ = quick_run
    rows = {(r["method"], r["category"]): r for r in data["rows"]}
    assert rows[(PLAIN, "overall")]["tau"] == 1.0
    assert rows[(PLAIN, "overall")]["same_as_plain"] == 1.0
    assert rows[(HF_PLAIN, "overall")]["same_as_plain"] == 1.0
    assert rows[(HF_PLAIN, "overall")]["tau"] == 1.0  # one token per target forward, counted by the hook
    assert rows[(PLAIN, "overall")]["acceptance_by_depth"] == []  # plain decode proposes nothing
    assert all(0.0 <= a <= 1.0 for r in data["rows"] for a in r["acceptance_by_depth"])


def test_hf_assistant_is_our_shipped_draft(default_model, hf_default_model) -> None:
    """The assisted-generation peer drafts with the same network as our `draft` drafter."""
    from specdec.benchmarks.peers import hf_assistant
    from specdec.drafters.heads.draft_folder import load_draft_folder, shipped_draft_dir
    from specdec.models.dense import dense_forward

    folder = shipped_draft_dir("smollm2-135m")
    assert folder is not None
    assistant = hf_assistant(hf_default_model, folder)
    assert assistant.config.num_hidden_layers == 2
    assert assistant.get_input_embeddings() is hf_default_model.get_input_embeddings()
    ours = load_draft_folder(folder, default_model)
    ids = torch.tensor([default_model.tokenizer.encode("The capital of France is Paris, and the capital of")])
    with torch.inference_mode():
        theirs = assistant(ids, output_hidden_states=True).hidden_states[-1]
        mine = dense_forward(ours, ids)
    torch.testing.assert_close(mine, theirs, atol=2e-4, rtol=1e-4)


def test_options_quick_defaults_and_overrides() -> None:
    quick = resolve_options(quick=True)
    assert (quick.max_new_tokens, quick.prompts_per_category, quick.methods) == (
        QUICK["max_new_tokens"], QUICK["prompts_per_category"], QUICK["methods"])
    assert resolve_options(quick=True, max_new_tokens=4).max_new_tokens == 4
    assert resolve_options(drafter="oracle:alpha=0.8").methods == "oracle:alpha=0.8"
    assert resolve_options(target="dummy:llama-3-8b", no_peers=True).peers == ()
    with pytest.raises(ConfigError, match="not both"):
        resolve_options(drafter="ngram", methods="draft")
    with pytest.raises(ConfigError, match="unknown peer"):
        resolve_options(peers="vllm")
    with pytest.raises(ConfigError, match="unknown categor"):
        resolve_options(categories="poetry")


def test_no_adaptive_reaches_every_methods_engine_and_the_reproducing_command(default_model) -> None:
    """--no-adaptive (full trees every step) is spelled out in the command a run records and set on every
    method's engine, plain decode's included; the default leaves adaptive speculation on."""
    from rich.console import Console

    from specdec.benchmarks.suite import build_ours

    assert resolve_options(quick=True).adaptive and "--no-adaptive" not in resolve_options(quick=True).command()
    options = resolve_options(quick=True, adaptive=False, methods="ngram;suffix", kv_cache_tokens=256)
    assert "--no-adaptive" in options.command()
    runners = build_ours(options, default_model, Console(quiet=True), [])
    assert len(runners) == 3
    assert all(r.llm.engine.planner is None for r in runners)
    adaptive = build_ours(resolve_options(quick=True, methods="ngram", kv_cache_tokens=256), default_model,
                          Console(quiet=True), [])
    assert all(r.llm.engine.planner is not None for r in adaptive)


def test_acceptance_by_depth_pools_counts_not_ratios() -> None:
    """alpha_d over several runs is total accepted / total proposed at depth d, as the engine defines it."""
    from specdec.benchmarks.runs import DepthCounter, Run, acceptance_by_depth

    counter = DepthCounter()
    tree = type("Tree", (), {"depth": torch.tensor([0, 1, 2, 3])})()
    for accepted in (3, 0, 1):
        counter(None, tree, type("Result", (), {"num_accepted_drafts": accepted})())
    assert (counter.proposed, counter.accepted) == ([3, 3, 3], [2, 1, 1])
    short = Run([1], 1.0, 1, 1, proposed=[1], accepted=[0])
    long = Run([2, 3], 1.0, 4, 3, proposed=counter.proposed, accepted=counter.accepted)
    assert acceptance_by_depth([short, long]) == pytest.approx([2 / 4, 1 / 3, 1 / 3])
    both = short + long
    assert (both.decoded, both.steps, both.proposed, both.accepted) == (5, 4, [4, 3, 3], [2, 1, 1])
