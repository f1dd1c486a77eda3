"""The command line, run as a user runs it: a subprocess of `python -m specdec.cli`, with this checkout's
package first on the path (not whichever specdec is installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--target", "dummy:tiny-llama", "--no-chat"]


def cli_env(extra: dict | None = None, path_first: str | None = None) -> dict:
    paths = [p for p in (path_first, str(ROOT), os.environ.get("PYTHONPATH")) if p]
    return {**os.environ, "COLUMNS": "80", "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(paths),
            **(extra or {})}


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "specdec.cli", *args]


def run_cli(*args: str, env: dict | None = None, path_first: str | None = None, stdin: str | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args), capture_output=True, text=True, timeout=timeout, input=stdin,
                          env=cli_env(env, path_first), cwd=ROOT)


def assert_user_error(result: subprocess.CompletedProcess, words: str) -> None:
    """Exit code 2, one red line naming the problem, no traceback."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert words.lower() in result.stderr.lower(), result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: "), result.stderr
