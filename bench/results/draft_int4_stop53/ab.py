"""A/B: the shipped draft's layers at int8 vs int4 (head int8): draft forward ms and tau, interleaved."""
import time, torch, sys
torch.set_num_threads(1)
from specdec import LLM, SamplingParams
from specdec.data import bench_prompts, CATEGORIES
from specdec.drafters import draft_model, model_drafter
from specdec.models import quant
from specdec.models.qlinear import QLinear
from torch import nn
split = sys.argv[1] if len(sys.argv) > 1 else "dev"
def make_int4_(module):
    def make(linear: nn.Linear):
        return QLinear.from_linear(linear, bits=4 if linear.out_features != 4096 else 8)
    return quant.quantize_int8_(module, make=make)
orig_q = draft_model.quantize_drafter_int8_
draft_model.quantize_drafter_int8_ = make_int4_
llm4 = LLM("smollm2-135m", quantize="int8", drafter="draft")
draft_model.quantize_drafter_int8_ = orig_q
llm8 = LLM("smollm2-135m", quantize="int8", drafter="draft")
print([type(m).__name__ + str(getattr(m, "bits", "")) for m in llm4.drafter.runner.model.layers[0].modules()][:8] )
prompts = [p["prompt"] for c in CATEGORIES for p in bench_prompts([c], split)[:2]]
sp = SamplingParams(max_new_tokens=64, temperature=0)
acc = {}
cur = ["?"]
of = draft_model.DraftModelDrafter._forward
def fw(self, feeds):
    t = time.perf_counter(); r = of(self, feeds); a = acc.setdefault(cur[0], [0.0, 0]); a[0] += time.perf_counter() - t; a[1] += 1; return r
draft_model.DraftModelDrafter._forward = fw
for llm in (llm4, llm8): llm.generate(prompts[:1], sp)
acc.clear()
stats = {}
for rep in range(2):
  for p in prompts:
    for name, llm in (("int4", llm4), ("int8", llm8)):
        cur[0] = name
        t = time.perf_counter(); out = llm.generate([p], sp)[0]; dt = time.perf_counter() - t
        s = stats.setdefault(name, [0.0, 0, 0]); s[0] += dt; s[1] += len(out.token_ids); s[2] += out.metrics.target_steps
for name in stats:
    s = stats[name]; a = acc[name]
    print(name, "tok/s %.1f" % (s[1] / s[0]), "steps", s[2], "tau %.3f" % (s[1] / max(s[2], 1)), "draft fwd %.3f ms" % (1000 * a[0] / a[1]))
