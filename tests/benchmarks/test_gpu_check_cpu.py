"""bench/gpu_check.py must keep running end to end: CI has no GPU, so it runs the same sections on CPU with
tiny shapes under the Triton interpreter, and every correctness row must pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_on_cpu_and_kernels_pass(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check_cpu.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--tiny", "--budget-s", "150", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    sections = {row["section"] for row in rows}
    assert {"bandwidth", "correctness", "timing"} <= sections
    checks = [row for row in rows if row["section"] == "correctness"]
    assert {row.get("kernel") for row in checks} >= {"paged_attention", "decode_attention", "write_kv", "copy_kv_slots"}
    assert all(row.get("passed") is True for row in checks), [row for row in checks if not row.get("passed")]
    assert all(row["triton_ms"] > 0 for row in rows if row["section"] == "timing")


def test_gpu_step_profile_runs_on_cpu(tmp_path: Path) -> None:
    """bench/gpu_step_profile.py (a lent GPU's host/GPU split of a step) keeps running: on CPU with a tiny target
    it times both steps and writes its JSON (no device time there, so those fields are zero)."""
    out = tmp_path / "step_profile.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_step_profile.py"), "--device", "cpu", "--target", "dummy:tiny-llama",
         "--dtype", "float32", "--context", "32", "--nodes", "8", "--steps", "2", "--top", "3", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["decode"]["wall_ms"] > 0 and report["tree8"]["wall_ms"] > 0
