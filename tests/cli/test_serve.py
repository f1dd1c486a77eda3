"""`specdec serve` as a user runs it: a subprocess that listens, answers the openai client, and refuses bad
options with one red line."""

from __future__ import annotations

import re
import subprocess
import time

import openai

from tests.cli.runner import ROOT, assert_user_error, cli_env, command, run_cli


def test_serve_answers_the_openai_client():
    proc = subprocess.Popen(command("serve", "--target", "dummy:tiny-llama", "--port", "0", "--threads", "1",
                                    "--model-name", "tiny"), stderr=subprocess.PIPE, text=True, env=cli_env(),
                            cwd=ROOT)
    try:
        port, deadline, seen = None, time.monotonic() + 120, []
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            match = re.search(r"running on http://127\.0\.0\.1:(\d+)", line)
            port = int(match.group(1)) if match else None
        assert port is not None, "".join(seen)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        out = client.completions.create(model="tiny", prompt="hello", max_tokens=5, temperature=0)
        assert out.usage.completion_tokens == 5
        # speculation is on by default: the hybrid on a 3-node chain, the best measured on both serving goals
        served = client.models.list().data[0].model_extra["specdec"]
        assert (served["drafter"], served["tree"]) == ("hybrid:suffix+recycle", "chain:k=2")
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()


def test_serve_bad_options_get_one_clear_line():
    assert_user_error(run_cli("serve", "--target", "dummy:tiny-llama", "--port", "70000"), "--port")
    assert_user_error(run_cli("serve", "--target", "dummy:tiny-llama", "--drafter", "nope"), "unknown drafter")
    assert_user_error(run_cli("serve", "--target", "dummy:tiny-llama", "--prefill-while-decoding", "-1"),
                      "--prefill-while-decoding")


def test_serve_names_the_model_as_the_user_named_the_target(monkeypatch):
    """An alias resolves to a folder before loading; clients still ask for the alias (the default: --target)."""
    import uvicorn
    from fastapi.testclient import TestClient

    import specdec.cli.generate as generate
    from specdec.api import LLM
    from specdec.cli.serve import serve

    def load_resolved(target, *args):  # what load_llm does for an alias: load from the folder it resolves to
        llm = LLM("dummy:tiny-llama", show_progress=False, num_threads=1)
        llm.target = f"/cache/models/{target}"
        return llm

    apps = []
    monkeypatch.setattr(generate, "load_llm", load_resolved)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: apps.append(app))
    serve(target="smollm2-135m", device="cpu", dtype="float32", quantize=None, drafter="none", tree=None,
          host="127.0.0.1", port=0, model_name=None, max_num_seqs=4, max_waiting=4, kv_cache_tokens=1024,
          kv_cache_dtype="auto", threads=1, adaptive=True, prefix_caching=True, prefill_while_decoding=None,
          log_level="warning")
    served = TestClient(apps[0]).get("/v1/models").json()["data"][0]["id"]
    assert served == "smollm2-135m"
