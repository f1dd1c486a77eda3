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


def test_where_flock_is_refused_a_lock_file_is_left_alone(tmp_path, monkeypatch):
    """Without a lock of ours (a file system that refuses flock), a lock file may be a live builder's: it stays,
    and the build goes on under torch's own lock."""
    import fcntl

    def refuse(*args):
        raise OSError("no locks here")

    monkeypatch.setattr(fcntl, "flock", refuse)
    (tmp_path / "lock").write_text("")
    with cpu._builder_lock(tmp_path):
        assert (tmp_path / "lock").exists()
    assert (tmp_path / "lock").exists()


def test_holding_the_lock_clears_a_dead_builders_lock_file(tmp_path):
    (tmp_path / "lock").write_text("")
    with cpu._builder_lock(tmp_path):
        assert not (tmp_path / "lock").exists()
