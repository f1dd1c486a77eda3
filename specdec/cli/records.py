"""Outputs as the JSON records `generate --json` prints and batch mode writes."""

from __future__ import annotations

from typing import Any


def output_record(out: Any) -> dict:
    """One output as JSON: text, tokens, finish reason, metrics, and logprobs when asked for."""
    record = {"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
              "metrics": out.metrics.to_dict()}
    if out.logprobs is not None:
        record["logprobs"] = [{"token_id": lp.token_id, "logprob": lp.logprob,
                               "top": [{"token_id": t, "logprob": v} for t, v in lp.top]} for lp in out.logprobs]
    return record
