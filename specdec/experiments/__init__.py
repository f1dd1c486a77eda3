"""Acceptance-rate experiments: measure how a drafter's trees are accepted, sweep configurations, and build
the static tree that a measured acceptance profile says is best.

    from specdec import LLM, SamplingParams
    from specdec.data import bench_prompts
    from specdec.experiments import measure_acceptance

    llm = LLM("smollm2-135m", quantize="int8")
    report = measure_acceptance(llm, bench_prompts(split="dev"), SamplingParams(max_new_tokens=48),
                                drafter="draft", tree="dynamic:depth=5,topk=4,budget=32")
    print(report.tau, report.alpha_by_depth)
    report.save_json("report.json"); report.save_csv("report.csv"); report.plot("report.png")
"""

from specdec.experiments.measure import describe_tree, measure_acceptance, split_prompts, sweep
from specdec.experiments.optimal_tree import AcceptanceProfile, expected_accepted_length, optimal_tree, save_tree
from specdec.experiments.report import AcceptanceReport, ExperimentSettings, load_reports, save_reports, write_csv
from specdec.experiments.stats import AcceptanceStats

__all__ = [
    "AcceptanceProfile", "AcceptanceReport", "AcceptanceStats", "ExperimentSettings", "describe_tree",
    "expected_accepted_length", "load_reports", "measure_acceptance", "optimal_tree", "save_reports", "save_tree",
    "split_prompts", "sweep", "write_csv",
]
