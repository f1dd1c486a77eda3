"""The experiment API gives numbers that agree with each other and with the raw verify steps, and its reports
survive JSON, CSV and PNG."""

from __future__ import annotations

import csv
import json

import pytest

from specdec.config import SamplingParams
from specdec.errors import ConfigError
from specdec.experiments import (AcceptanceReport, AcceptanceStats, load_reports, measure_acceptance, save_reports,
                                 sweep)
from tests.experiments.tiny import id_prompts

PARAMS = SamplingParams(max_new_tokens=24)


def records(n: int) -> list[dict]:
    return [{"prompt": ids, "category": "ab"[i % 2]} for i, ids in enumerate(id_prompts(n))]


@pytest.fixture(scope="module")
def measured(tiny_llm):
    """A report on a branching tree, plus every (tree, result) the engine verified, seen by our own observer."""
    seen = []

    def spy(seq, tree, result):
        seen.append((tree, result))

    tiny_llm.use("oracle:alpha=0.7,seed=1", "static:tree-16")
    tiny_llm.engine.step_observers.append(spy)
    planner = tiny_llm.engine.planner
    report = measure_acceptance(tiny_llm, records(6), PARAMS, chat=False)
    observers = list(tiny_llm.engine.step_observers)
    restored = tiny_llm.engine.planner
    return report, seen, observers, (planner, restored)


def test_the_observer_is_removed_and_the_planner_restored(measured):
    report, seen, observers, (planner, restored) = measured
    assert len(observers) == 1 and observers[0].__name__ == "spy"
    assert restored is planner and report.settings.adaptive is False


def test_tau_is_tokens_over_steps_and_the_histogram_counts_every_step(measured):
    report, seen, _, _ = measured
    s = report.stats
    assert s.steps == len(seen) > 0
    assert s.tokens == sum(len(result.tokens) for _, result in seen)
    assert report.tau == pytest.approx(s.tokens / s.steps)
    assert sum(report.accepted_length_hist) == s.steps
    assert sum((a + 1) * n for a, n in enumerate(report.accepted_length_hist)) == s.tokens
    assert report.tau == pytest.approx(1 + s.mean_accepted)


def test_alpha_by_depth_matches_counts_from_the_raw_steps(measured):
    report, seen, _, _ = measured
    offered, accepted = [0] * 8, [0] * 8
    for tree, result in seen:
        path = result.accepted_nodes
        for d in range(1, len(path) + 1):  # the node reached at depth d-1 offers depth d if it has children
            if tree.children[path[d - 1]]:
                offered[d - 1] += 1
                accepted[d - 1] += d < len(path)
    depth = len(report.stats.depth_offered)
    assert report.stats.depth_offered == offered[:depth] and not any(offered[depth:])
    assert report.stats.depth_accepted == accepted[:depth]
    assert report.alpha_by_depth == [a / o for a, o in zip(accepted[:depth], offered[:depth])]


def test_acceptance_by_rank_counts_each_sibling_position(measured):
    report, seen, _, _ = measured
    s = report.stats
    assert s.rank_offered[0] == [s.steps] * 3  # tree-16 gives the root three children, every step
    root_hits = [0, 0, 0]
    for tree, result in seen:
        if len(result.accepted_nodes) > 1:
            root_hits[tree.children[0].index(result.accepted_nodes[1])] += 1
    assert s.rank_accepted[0] == root_hits
    assert report.acceptance_by_rank[0] == [h / s.steps for h in root_hits]
    # a depth's acceptance is the sum over its ranks (one child at most is accepted)
    for d, row in enumerate(s.rank_accepted):
        assert sum(row) == s.depth_accepted[d]


def test_categories_partition_the_steps_and_times_come_from_request_metrics(measured):
    report, _, _, _ = measured
    assert sorted(report.categories) == ["a", "b"]
    merged = report.categories["a"].merge(report.categories["b"])
    assert merged.to_dict() == report.stats.to_dict()
    assert report.stats.requests == 6 and report.stats.generated_tokens == 6 * PARAMS.max_new_tokens
    assert report.draft_time_s > 0 and report.verify_time_s > 0
    assert report.settings.num_prompts == 6 and report.settings.tree == "static:tree-16"


def test_json_round_trip_csv_and_png(measured, tmp_path):
    pytest.importorskip("matplotlib")
    report = measured[0]
    back = AcceptanceReport.load_json(report.save_json(tmp_path / "r.json"))
    assert back.to_dict() == report.to_dict() and back.tau == report.tau
    with report.save_csv(tmp_path / "r.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["scope"] for r in rows] == ["all", "a", "b"]
    assert float(rows[0]["tau"]) == pytest.approx(report.tau, abs=1e-4)
    assert int(rows[0]["hist_0"]) == report.accepted_length_hist[0]
    png = report.plot(tmp_path / "plots" / "r.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sampled_runs_repeat_exactly_with_the_same_seed(tiny_llm):
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    first = measure_acceptance(tiny_llm, id_prompts(3), params, drafter="draft:layers=1", tree="chain:k=3",
                               seed=5, chat=False)
    again = measure_acceptance(tiny_llm, id_prompts(3), params, drafter="draft:layers=1", tree="chain:k=3",
                               seed=5, chat=False)
    assert first.stats.accepted_hist == again.stats.accepted_hist
    assert first.stats.rank_accepted == again.stats.rank_accepted and first.settings == again.settings


def test_sweep_runs_the_grid_and_saves_one_file_set(tiny_llm, tmp_path):
    pytest.importorskip("matplotlib")
    seen = []
    reports = sweep(tiny_llm, id_prompts(2), drafters=["none", "oracle:alpha=0.5"], trees=[None, "chain:k=2"],
                    temperatures=[0.0, 1.0], sampling=SamplingParams(max_new_tokens=8), chat=False,
                    on_report=seen.append)
    assert len(reports) == 6 and seen == reports  # plain decode once per temperature: it has no tree
    assert [(r.settings.drafter, r.settings.tree, r.settings.temperature) for r in reports[:2]] == [
        ("none", "chain:k=0", 0.0), ("none", "chain:k=0", 1.0)]
    assert [(r.settings.drafter, r.settings.tree, r.settings.temperature) for r in reports[2:]] == [
        ("oracle:alpha=0.5", "chain:k=5", 0.0), ("oracle:alpha=0.5", "chain:k=5", 1.0),
        ("oracle:alpha=0.5", "chain:k=2", 0.0), ("oracle:alpha=0.5", "chain:k=2", 1.0)]
    assert all(r.tau == 1.0 for r in reports[:2])  # plain decode
    paths = save_reports(reports, tmp_path / "sweep")
    assert sorted(paths) == ["csv", "json", "png"]
    assert [r.to_dict() for r in load_reports(paths["json"])] == [r.to_dict() for r in reports]
    assert json.loads(paths["json"].read_text())["reports"][3]["settings"]["temperature"] == 1.0


def test_bad_inputs_are_config_errors(tiny_llm, tmp_path):
    with pytest.raises(ConfigError, match="prompt"):
        measure_acceptance(tiny_llm, [{"text": "no prompt key"}], PARAMS)
    with pytest.raises(ConfigError, match="no report file"):
        AcceptanceReport.load_json(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="at least one"):
        sweep(tiny_llm, id_prompts(1), drafters=[])
    assert AcceptanceStats().tau == 0.0 and AcceptanceStats().alpha_by_depth == []
