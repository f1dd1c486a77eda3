"""Building the compiled CPU kernels survives a build that was killed part way."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from specdec.kernels import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="no compiled CPU kernels here (no compiler)")


def test_a_lock_file_left_by_a_killed_build_does_not_hang_the_next_process(tmp_path):
    """torch's builder waits for as long as its `lock` file exists, and a build killed part way (Ctrl-C on the
    first run) leaves one behind: every later process used to hang on it (`_builder_lock`). The check runs on a
    copy of the built folder under its own cache root, so no other test process ever meets the planted lock."""
    name, build, _ = cpu._build_folder()
    assert (build / f"{name}.so").exists()  # built: available() said so
    copy = tmp_path / build.relative_to(build.parents[2])  # kernels/torch-<version>/<name>, as _build_folder names it
    shutil.copytree(build, copy)  # modification times kept: ninja finds the library up to date
    (copy / "lock").write_text("")  # what a killed builder leaves
    try:
        done = subprocess.run([sys.executable, "-c", "from specdec.kernels import cpu; print(cpu.available())"],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "SPECDEC_CACHE": str(tmp_path)})
    except subprocess.TimeoutExpired:
        pytest.fail("a process hung on the lock file a killed build left behind")
    assert done.stdout.strip().endswith("True"), done.stderr[-2000:]
    assert not (copy / "lock").exists()
