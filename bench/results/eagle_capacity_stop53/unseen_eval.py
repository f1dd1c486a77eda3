"""Agreement of two from-scratch probe heads (one layer, then two) on 64 unseen ShareGPT answers of the corpus
(`seen_unseen.py`'s unseen picks).

    python unseen_eval.py [ONE_LAYER_RUN TWO_LAYER_RUN]   # default: the 200-step pair /work/runs/eagle-scratch{1,2}
"""
import sys, torch
from pathlib import Path
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[2]), str(HERE.parents[2] / "bench"), str(HERE)]
import eagle_extra_layers as probe
from seen_unseen import answer_sets, eval_data, reduced_head
from specdec.models.loader import load_model
from specdec.training import eagle as te

torch.set_num_threads(2)
loaded = load_model("smollm2-135m", "cpu", "float32", show_progress=False)
target = loaded.model
own, pairs, _, pick = answer_sets(loaded)
data = eval_data(target, pairs, pick)
head = reduced_head(target, own)
te.DenseAttention = probe.LayeredAttention
runs = sys.argv[1:3] or ["/work/runs/eagle-scratch1", "/work/runs/eagle-scratch2"]
for extra, run in enumerate(runs):
    probe.EXTRA_LAYERS = extra
    model = probe.init_predictor(target, 1, None, 6)
    checkpoint = torch.load(Path(run) / "checkpoint.pt", weights_only=False)
    model.load_state_dict(checkpoint["params"])
    print(run, "step", checkpoint["state"]["step"], flush=True)
    r = te.evaluate(model, target, data, list(range(64)), ttt_steps=2, head=head)
    print(run, extra, {k: round(v, 4) for k, v in r.items() if "top1" in k or "ce" in k or "regression" in k}, flush=True)
