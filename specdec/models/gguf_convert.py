"""Convert a llama-family GGUF file into a Hugging Face folder, once.

Loading a GGUF through transformers dequantizes every tensor and rebuilds the tokenizer on every load
(~35 s for SmolLM2-135M). We do that work once and keep the result as an ordinary HF folder
(`model.safetensors` in float32, or bfloat16 for large models, `config.json`, tokenizer files), which then
loads in about a second. Tensors are converted one at a time (specdec/models/gguf_tensors.py), so a 1.5B
model converts in about the memory of its GGUF file.

The folder is assembled in a hidden sibling directory and renamed into place at the end, so a crash or
Ctrl-C never leaves a half-written model behind. Heavy imports (torch, transformers, gguf) happen inside
the functions so that `specdec models` and friends stay fast.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from specdec.errors import CorruptModelError, ModelLoadError, UnsupportedModelError
from specdec.models.cache import cache_root
from specdec.models.gguf_tensors import plan_tensors, write_safetensors

# Bump when the folder layout or tensor conversion changes: cached folders with an older version are
# converted again.
CONVERSION_VERSION = 1
SOURCE_FILE = "specdec_source.json"

# `general.architecture` values whose tensors map onto a llama-style transformers model, and the
# transformers model types they may become (llama.cpp stores Mistral as "llama").
_GGUF_ARCHITECTURES = ("llama", "qwen2")
_MODEL_TYPES = ("llama", "mistral", "qwen2")
_HASH_CHUNK = 1 << 20


def convert_gguf(
    gguf_path: Path,
    out_dir: Path,
    show_progress: bool = True,
    *,
    source_info: dict[str, Any] | None = None,
    expected_sha256: str | None = None,
    store_dtype: str = "float32",
    eos_token_ids: tuple[int, ...] = (),
) -> Path:
    """Convert `gguf_path` into an HF folder at `out_dir` (replacing it atomically) and return `out_dir`.

    `source_info` adds fields (for example the alias and wheel it came from) to `specdec_source.json`.
    Raises `ModelLoadError` when the file is not a readable GGUF, `UnsupportedModelError` when its
    architecture is not llama-family, and `CorruptModelError` (writing nothing) when its sha256 is not
    `expected_sha256` or a tensor holds NaN or Inf values: a damaged file must never become a cached model
    that quietly generates token 0. `store_dtype` ("float32" or "bfloat16") is the weights' precision on
    disk; `eos_token_ids`, when given, replaces the config's stop token(s) (Qwen ends chat turns with one token
    and documents with another).
    """
    if store_dtype not in ("float32", "bfloat16"):
        raise ModelLoadError(f"cannot store converted weights as {store_dtype!r}; use float32 or bfloat16")
    gguf_path = Path(gguf_path).expanduser().resolve()
    out_dir = Path(out_dir).expanduser().absolute()
    started = time.perf_counter()
    with _Stages(show_progress) as stages:
        stages.start("reading GGUF")
        reader = _open_reader(gguf_path)
        architecture = _field(reader, "general.architecture")
        if architecture not in _GGUF_ARCHITECTURES:
            raise UnsupportedModelError(
                f"cannot read GGUF file {gguf_path}: architecture {architecture!r} is not supported "
                f"(specdec runs llama-family models: {', '.join(_GGUF_ARCHITECTURES)})"
            )
        config = _read_config(gguf_path)
        sha256 = _sha256(gguf_path)
        if expected_sha256 is not None and sha256 != expected_sha256:
            raise CorruptModelError(
                f"{gguf_path} is named like a published model file but is not it: sha256 {sha256}, expected "
                f"{expected_sha256}. The file is damaged or altered; download it again"
            )

        plan = plan_tensors(reader, architecture, config, gguf_path)
        if eos_token_ids:
            config.eos_token_id = list(eos_token_ids)

        stages.start("converting tokenizer")
        tokenizer = _read_tokenizer(gguf_path, config)

        stages.start(f"dequantizing to {store_dtype}", total=len(plan))
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(out_dir)
        tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir()
            tensors = functools.partial(write_safetensors, plan=plan, dtype=store_dtype, architecture=architecture,
                                        config=config, gguf_path=gguf_path, advance=stages.advance)
            _write_folder(tmp, tensors, config, tokenizer, store_dtype)
            source = {
                "source_file": gguf_path.name,
                "source_path": str(gguf_path),
                "size": gguf_path.stat().st_size,
                "sha256": sha256,
                "conversion_version": CONVERSION_VERSION,
                "gguf_architecture": architecture,
                "gguf_file_type": _file_type_name(reader),
                "tie_word_embeddings": bool(config.tie_word_embeddings),
                "store_dtype": store_dtype,
                "converted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                **(source_info or {}),
            }
            (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
            _replace_dir(tmp, out_dir)
        except OSError as e:
            raise ModelLoadError(f"cannot write the converted model to {out_dir}: {e}") from e
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if show_progress:
        elapsed = time.perf_counter() - started
        _console().print(f"converted {gguf_path.name} -> {out_dir} in {elapsed:.1f} s", soft_wrap=True)
    return out_dir


def gguf_cache_dir(gguf_path: Path) -> Path:
    """Where a user-provided `.gguf` is converted: keyed by file name, size and mtime, so an edited or
    replaced file converts again and an unchanged one converts once."""
    gguf_path = Path(gguf_path).expanduser().resolve()
    try:
        st = gguf_path.stat()
    except OSError as e:
        raise ModelLoadError(f"cannot read GGUF file {gguf_path}: {e.strerror or e}") from e
    key = hashlib.sha256(f"{gguf_path.name}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_root() / "gguf" / f"{gguf_path.stem}-{key}"


def ensure_converted(gguf_path: Path, show_progress: bool = True) -> Path:
    """The converted HF folder for a user-provided `.gguf`, converting it on first use only."""
    out_dir = gguf_cache_dir(gguf_path)
    if is_current(out_dir):
        return out_dir
    return convert_gguf(gguf_path, out_dir, show_progress)


def read_source_info(folder: Path) -> dict[str, Any] | None:
    """The `specdec_source.json` of a converted folder, or None when absent or unreadable."""
    try:
        return json.loads((Path(folder) / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None


def is_current(folder: Path, sha256: str | None = None) -> bool:
    """True when `folder` is a complete conversion by this conversion version (of `sha256`, if given)."""
    info = read_source_info(folder)
    if info is None or info.get("conversion_version") != CONVERSION_VERSION:
        return False
    return sha256 is None or info.get("sha256") == sha256


# --- reading -------------------------------------------------------------------------------------------


def _open_reader(gguf_path: Path):
    from gguf import GGUFReader

    try:
        with gguf_path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(f"cannot read GGUF file {gguf_path}: {e.strerror or e}") from e
    if magic != b"GGUF":
        raise ModelLoadError(
            f"cannot read GGUF file {gguf_path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')"
        )
    try:
        return GGUFReader(gguf_path)
    except Exception as e:  # the reader raises bare ValueErrors/IndexErrors from numpy on bad data
        size = gguf_path.stat().st_size
        raise ModelLoadError(
            f"cannot read GGUF file {gguf_path}: the file is truncated or corrupt ({size:,} bytes; {e})"
        ) from e


def _field(reader, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _file_type_name(reader) -> str | None:
    from gguf import LlamaFileType

    value = _field(reader, "general.file_type")
    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return None if value is None else str(value)


def _read_config(gguf_path: Path):
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    except Exception as e:
        raise ModelLoadError(f"cannot read GGUF file {gguf_path}: bad model metadata ({e})") from e
    if config.model_type not in _MODEL_TYPES:
        raise UnsupportedModelError(
            f"cannot read GGUF file {gguf_path}: model type {config.model_type!r} is not supported "
            f"(specdec runs llama-family models: {', '.join(_MODEL_TYPES)})"
        )
    return config


def _read_tokenizer(gguf_path: Path, config):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    except Exception as e:
        raise ModelLoadError(f"cannot read GGUF file {gguf_path}: cannot build its tokenizer ({e})") from e
    tokenizer.model_max_length = config.max_position_embeddings
    return tokenizer


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# --- writing -------------------------------------------------------------------------------------------


def _write_folder(folder: Path, write_tensors, config, tokenizer, store_dtype: str = "float32") -> None:
    import torch
    from transformers import GenerationConfig

    config.dtype = getattr(torch, store_dtype)
    weights = folder / "model.safetensors"
    write_tensors(weights)
    config.save_pretrained(folder)
    weights.chmod((folder / "config.json").stat().st_mode & 0o777)  # safetensors writes 0600
    GenerationConfig.from_model_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    _complete_tokenizer_files(folder, tokenizer)


def _complete_tokenizer_files(folder: Path, tokenizer) -> None:
    """transformers 5 keeps the chat template in chat_template.jinja and no longer writes
    special_tokens_map.json; add both back for readers that expect the older layout."""
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for load_time_key in ("is_local", "local_files_only"):
        cfg.pop(load_time_key, None)
    if tokenizer.chat_template and "chat_template" not in cfg:
        cfg["chat_template"] = tokenizer.chat_template
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    special = folder / "special_tokens_map.json"
    if not special.exists():
        special.write_text(json.dumps(tokenizer.special_tokens_map, indent=2, ensure_ascii=False) + "\n")


def _replace_dir(tmp: Path, out_dir: Path) -> None:
    """Rename `tmp` to `out_dir`; an existing `out_dir` is moved aside first and deleted afterwards."""
    old = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        out_dir.rename(old)
    try:
        tmp.rename(out_dir)
    except OSError:
        if old is not None and not out_dir.exists():
            old.rename(out_dir)
            old = None
        if not is_current(out_dir):  # another process finished the same conversion first: keep theirs
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_stale_partials(out_dir: Path) -> None:
    """Delete leftovers of conversions whose process died (SIGKILL, power loss)."""
    for pattern in (f".{out_dir.name}.partial-*", f".{out_dir.name}.old-*"):
        for path in out_dir.parent.glob(pattern):
            try:
                pid = int(path.name.rsplit("-", 2)[-2])
            except ValueError:
                continue
            if not _pid_alive(pid):
                shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


# --- progress ------------------------------------------------------------------------------------------


def _console():
    from rich.console import Console

    return Console(stderr=True)


class _Stages(contextlib.AbstractContextManager):
    """A transient progress line per stage on a terminal (spinner, stage name, a bar for stages with a
    total, time); one plain line per stage elsewhere, for logs."""

    def __init__(self, show: bool):
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = _console()
        self._log = console if show and not console.is_terminal else None
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("converting GGUF: {task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not show or self._log is not None,
        )
        self._task = None

    def __enter__(self) -> _Stages:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def start(self, stage: str, total: int | None = None) -> None:
        if self._log is not None:
            self._log.print(f"converting GGUF: {stage}", soft_wrap=True)
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(stage, total=total)

    def advance(self) -> None:
        self._progress.advance(self._task)
