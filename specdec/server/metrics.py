"""Prometheus metrics for `GET /metrics`, in one registry per server (tests run several in one process).

Latency is measured where the client sees it: TTFT from the moment the server received the request to the
engine step that produced the first token; inter-token latency per token, a step that emits k tokens after a
gap of t counting k tokens of t/k each (speculation emits several tokens per step, and a per-chunk figure would
make it look slower than it is). Speculation counters come from the engine's step observer, on the engine
thread; prometheus_client's metrics are thread-safe.
"""

from __future__ import annotations

from typing import Callable

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from specdec.engine.async_engine import EngineStats
from specdec.engine.outputs import RequestOutput

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.5, 3.0, 6.0, 12.0, 30.0, 60.0)
STEP_BUCKETS = tuple(float(i) for i in range(1, 17))
DEPTH_BUCKETS = tuple(float(i) for i in range(0, 17))


class ServerMetrics:
    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        disable_created_metrics()  # process-wide: the `_created` twin of every series is noise for a server
        self.registry = r = CollectorRegistry()
        self.requests = Counter("specdec_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.finished = Counter("specdec_request_finish", "Finished generations by finish reason (abort = the "
                                "client left)", ["reason"], registry=r)
        self.prompt_tokens = Counter("specdec_prompt_tokens", "Prompt tokens of accepted requests", registry=r)
        self.generation_tokens = Counter("specdec_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram("specdec_time_to_first_token_seconds", "Request received to first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("specdec_inter_token_latency_seconds", "Time per output token after the first",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("specdec_e2e_request_latency_seconds", "Request received to last token",
                             buckets=TTFT_BUCKETS, registry=r)
        gauge = [("specdec_num_requests_running", "Sequences in the running batch", lambda s: s.running),
                 ("specdec_num_requests_waiting", "Requests waiting for a batch slot", lambda s: s.waiting),
                 ("specdec_kv_blocks_used", "KV cache blocks in use", lambda s: s.kv_blocks_used),
                 ("specdec_kv_blocks_total", "KV cache blocks in the pool", lambda s: s.kv_blocks_total),
                 ("specdec_engine_steps", "Engine steps run so far", lambda s: s.steps)]
        for name, doc, read in gauge:
            Gauge(name, doc, registry=r).set_function(lambda read=read: read(stats()))
        self.drafted = Counter("specdec_spec_drafted_tokens", "Drafted tokens verified, by depth in the tree "
                               "(1 = first drafted token)", ["position"], registry=r)
        self.accepted = Counter("specdec_spec_accepted_tokens", "Drafted tokens accepted, by position",
                                ["position"], registry=r)
        self.steps = Counter("specdec_spec_sequence_steps", "Decode steps over all sequences", registry=r)
        self.emitted = Counter("specdec_spec_emitted_tokens", "Tokens emitted by decode steps (accepted + bonus)",
                               registry=r)
        self.tokens_per_step = Histogram("specdec_spec_tokens_per_step", "Tokens one sequence emitted in one "
                                         "target step (tau per step; 1 = nothing accepted)", buckets=STEP_BUCKETS,
                                         registry=r)
        self.depth = Histogram("specdec_spec_planned_depth", "Tree depth the planner chose for a sequence's step "
                               "(0 = plain decode)", buckets=DEPTH_BUCKETS, registry=r)
        Gauge("specdec_spec_mean_accepted_tokens", "tau over the server's life: emitted tokens per decode step",
              registry=r).set_function(self._tau)

    def _tau(self) -> float:
        steps = self.steps._value.get()
        return self.emitted._value.get() / steps if steps else 0.0

    def observe_step(self, seq, tree, result) -> None:
        """Engine step observer: one decoding sequence's tree and what was accepted from it."""
        nodes = torch.bincount(tree.depth).tolist()
        for position in range(1, len(nodes)):
            self.drafted.labels(str(position)).inc(nodes[position])
        for position in range(1, result.num_accepted_drafts + 1):
            self.accepted.labels(str(position)).inc()
        self.steps.inc()
        self.emitted.inc(len(result.tokens))
        self.tokens_per_step.observe(len(result.tokens))
        self.depth.observe(len(nodes) - 1)

    def observe_finish(self, output: RequestOutput) -> None:
        self.finished.labels(output.finish_reason or "unknown").inc()
        self.generation_tokens.inc(len(output.token_ids))

    def render(self) -> bytes:
        return generate_latest(self.registry)
