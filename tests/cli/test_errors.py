"""Ordinary bad input and faults through the command line (issue 18): one red line, exit code 2, no traceback,
and checked before the model loads where it can be. Also the cosmetic defects users saw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.runner import ROOT, TINY, assert_user_error, cli_env, run_cli

MISSING_MODEL = ["--target", "/no/such/model"]  # reaching the model load would say "model not found"


@pytest.mark.parametrize("args, words", [
    (["--seed", "99999999999999999999"], "seed must be an integer from 0 to 2**64 - 1"),
    (["--seed", "-1"], "seed must be"),
    (["--max-concurrency", "0"], "--max-concurrency must be a positive integer"),
    (["--drafter", "ngram:k=1000"], "--max-tree-nodes"),
    (["--drafter", "ngram:q=3"], "unknown option(s) for drafter 'ngram': q"),
    (["--drafter", "ngram:k=x"], "drafter option k must be an integer"),
    (["--drafter", "none", "--tree", "chain:k=3"], "drafter 'none' drafts nothing"),
    (["--drafter", "ngram", "--tree", "chain:k=0"], "chain:k=0 drafts nothing"),
    (["--drafter", "ngram", "--tree", "spiral"], "unknown tree kind"),
    (["--quantize", "int3"], "unknown quantization"),
    (["--threads", "0"], "--threads must be an integer from 1"),
    (["--stop", ""], "stop strings must be non-empty"),
])
def test_bad_options_are_refused_before_the_model_loads(args, words):
    assert_user_error(run_cli("generate", "hi", *MISSING_MODEL, *args), words)


def test_a_prompt_with_bytes_that_are_not_utf8_is_a_clear_error(tmp_path):
    """Issue 18: a TypeError from inside the tokenizer. argv holds the raw byte 0xff here."""
    script = ("import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-m', 'specdec.cli', 'generate', "
              "b'caf\\xff'.decode('utf-8', 'surrogateescape'), '--target', '/no/such/model']).returncode)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=cli_env(), cwd=ROOT,
                            timeout=300)
    assert_user_error(result, "not valid UTF-8 text: it holds the byte 0xff")


def test_a_static_tree_file_with_fractional_ranks_or_foreign_keys_is_refused(tmp_path):
    fractional = tmp_path / "frac.json"
    fractional.write_text(json.dumps({"choices": [[0], [0.7]]}))
    assert_user_error(run_cli("generate", "hi", *MISSING_MODEL, "--drafter", "ngram", "--tree", f"static:{fractional}"),
                      "ranks are integers")
    parents = tmp_path / "parents.json"
    parents.write_text(json.dumps({"choices": [[0], [0, 0]], "parents": [-1, 0, 1]}))
    assert_user_error(run_cli("generate", "hi", *MISSING_MODEL, "--drafter", "ngram", "--tree", f"static:{parents}"),
                      "'parents'")


def test_nan_weights_stop_generation_with_a_clear_error(tmp_path):
    """Issue 18: a corrupt model generated empty text (token 0 every step) with exit code 0."""
    from safetensors.torch import load_file, save_file

    from tests.models.test_gguf_convert import write_tiny_gguf
    from specdec.models.gguf_convert import convert_gguf

    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf)
    folder = convert_gguf(gguf, tmp_path / "model", show_progress=False)
    weights = load_file(folder / "model.safetensors")
    weights["model.layers.1.mlp.down_proj.weight"][0, :] = float("nan")  # damaged after conversion
    save_file(weights, str(folder / "model.safetensors"))
    result = run_cli("generate", "hello", "--target", str(folder), "--max-new-tokens", "4")
    assert_user_error(result, "NaN/Inf logits")
    assert result.stdout.strip() == ""


def test_one_token_stats_do_not_claim_a_speed_or_tau():
    """Issue 18: '1 tokens, 0.0 tok/s, tau 0.00 over 0 target steps'; and the line must not wrap off a terminal."""
    result = run_cli("generate", "hi", *TINY, "--max-new-tokens", "1")
    assert result.returncode == 0, result.stderr
    stats = result.stderr.strip().splitlines()
    assert len(stats) == 1, result.stderr
    assert stats[0].startswith("1 token, TTFT") and stats[0].endswith("finish: length")
    assert "tok/s" not in stats[0] and "tau" not in stats[0]
    narrow = run_cli("generate", "hi hi hi hi", *TINY, "--max-new-tokens", "9", "--drafter", "ngram",
                     env={"COLUMNS": "40"})
    lines = narrow.stderr.strip().splitlines()
    assert len(lines) == 1, narrow.stderr  # one line however narrow the (absent) terminal
    assert "tok/s" in lines[0] and "target steps" in lines[0] and lines[0].endswith("finish: length")


def test_a_conversion_shows_its_bars_before_the_loading_spinner_starts(monkeypatch):
    """Issue 18: the spinner and the conversion bars drew over each other. The CLI now fetches/converts first
    (bars on their own), then shows the spinner for the load alone."""
    import specdec.api
    import specdec.models.loader
    from specdec.cli import generate
    from specdec.config import EngineConfig

    events = []
    monkeypatch.setattr(specdec.models.loader, "resolve_target",
                        lambda target, show_progress: events.append(("resolve", show_progress)) or Path("/m"))

    class Status:
        def __enter__(self):
            events.append("spinner on")

        def __exit__(self, *exc):
            events.append("spinner off")

    monkeypatch.setattr(generate.err_console, "status", lambda text: Status())
    monkeypatch.setattr(specdec.api, "LLM", lambda **kw: events.append(("load", kw["target"], kw["show_progress"])))
    generate.load_llm("smollm2-135m", "cpu", "float32", None, "none", None, EngineConfig(), None)
    assert events == [("resolve", True), "spinner on", ("load", "/m", False), "spinner off"]


def test_streamed_text_is_not_wrapped_by_a_console():
    result = run_cli("generate", "x", *TINY, "--max-new-tokens", "200")
    assert result.returncode == 0, result.stderr
    out = json.loads(run_cli("generate", "x", *TINY, "--max-new-tokens", "200", "--json").stdout)
    assert result.stdout == out["text"] + "\n"


def test_help_lists_every_drafter_and_tree_in_full_at_80_columns():
    result = run_cli("generate", "--help")
    assert result.returncode == 0, result.stderr
    for spec in ("ngram[:n=3,k=8,branches=1]", "draft:layers=N", "eagle3[:PATH]", "oracle:alpha=0.8", "chain:k=5",
                 "dynamic:depth=6,topk=8,budget=60", "static:NAME"):
        assert spec in result.stdout, spec  # whole, on one line: nothing cut
    assert "…" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_help_and_models_do_not_import_torch():
    code = ("import sys, runpy; sys.argv = ['specdec', 'models']; "
            "import specdec.cli.app as app\ntry: app.main()\nexcept SystemExit: pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'; print('no torch')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=ROOT,
                            timeout=300)
    assert result.returncode == 0 and "no torch" in result.stdout, result.stderr


def test_import_specdec_does_not_import_torch():
    code = ("import sys, specdec; from specdec import SamplingParams, EngineConfig, SpecdecError; "
            "SamplingParams(seed=1); EngineConfig(); assert 'torch' not in sys.modules; "
            "from specdec import LLM; assert 'torch' in sys.modules; print('lazy')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=ROOT,
                            timeout=300)
    assert result.returncode == 0 and "lazy" in result.stdout, result.stderr


def test_bench_without_matplotlib_names_the_extra_before_running(tmp_path):
    """Issue 18: `specdec bench --quick` crashed with ModuleNotFoundError after 81 s."""
    shadow = tmp_path / "shadow"
    (shadow / "matplotlib").mkdir(parents=True)
    (shadow / "matplotlib" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n")
    out = tmp_path / "results"
    result = run_cli("bench", "--quick", "--target", "/no/such/model", "--out", str(out), path_first=str(shadow))
    assert_user_error(result, "pip install 'specdec[bench]'")
    assert "--no-plots" in result.stderr
    assert not out.exists()


def test_bench_writes_under_the_working_directory_by_default(tmp_path):
    from specdec.benchmarks.suite import resolve_options

    out = resolve_options(quick=True).out
    assert not out.is_absolute() and out.parts[0] == "runs"  # relative to the cwd; runs/ is git-ignored here
    assert (ROOT / ".gitignore").read_text().splitlines().count("runs/") == 1
