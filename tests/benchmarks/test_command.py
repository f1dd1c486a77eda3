"""A results file's command parses back to the arguments the bench ran with."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

from specdec.benchmarks.command import command_line


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--methods", default="none;hybrid:suffix+recycle")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--label", default=None)
    p.add_argument("--tree", action="append")
    p.add_argument("--llama-cpp", action="store_true")
    p.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--out", type=Path, default=Path("bench/results/x.json"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


@pytest.mark.parametrize("argv", [
    [],
    ["--methods", "none;suffix|chain:k=3", "--per-category", "7", "--llama-cpp", "--no-adaptive"],
    ["--label", "it's \"quoted\" $HOME", "--tree", "none", "--tree", "dynamic:depth=4,topk=3,budget=4"],
    ["--out", "/tmp/a dir/out.json", "--adaptive"],
])
def test_the_command_parses_back_to_the_same_arguments(argv):
    p = parser()
    args = p.parse_args(argv)
    line = command_line("bench/x.py", p, args, env="OMP_NUM_THREADS=1")
    words = shlex.split(line)
    assert words[:3] == ["OMP_NUM_THREADS=1", "python", "bench/x.py"]
    assert p.parse_args(words[3:]) == args


def test_flags_at_their_default_skipped_options_and_hidden_ones_are_left_out():
    p = parser()
    args = p.parse_args(["--worker"])
    line = command_line("bench/x.py", p, args, skip=("out",))
    assert "--llama-cpp" not in line and "--out" not in line and "--worker" not in line and "--label" not in line
    assert "--adaptive" in line and "--methods 'none;hybrid:suffix+recycle'" in line
