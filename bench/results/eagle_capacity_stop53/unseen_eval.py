"""Agreement of the two from-scratch probe heads on 64 unseen ShareGPT answers of the corpus (same picks as fit_gap2)."""
import sys, json, random, torch
ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "bench"))
torch.set_num_threads(2)
from pathlib import Path
import eagle_extra_layers as probe
from specdec.models.loader import load_model
from specdec.training import eagle as te
from specdec.training.common import load_corpus, read_corpus, Corpus
loaded = load_model("smollm2-135m", "cpu", "float32", show_progress=False)
target = loaded.model
own = load_corpus(Path("/work/runs/own_corpus.pt"))
store = read_corpus(str(Path("~/.cache/specdec/corpora/smollm2-135m").expanduser()), loaded)
used = {tuple(p) for p in own.prompt_ids}
pairs = list(zip(store.prompt_ids, store.response_ids))
unseen = [i for i in range(len(pairs) * 6 // 10, len(pairs)) if tuple(pairs[i][0]) not in used]
rng = random.Random(0)
seen = [i for i in range(len(pairs)) if tuple(pairs[i][0]) in used][:2000]
rng.sample(seen, 64)
pick = rng.sample(unseen, 64)
part = Corpus([pairs[i][0] for i in pick], [pairs[i][1] for i in pick])
rec = te.record(target, part, 1, True)
data = te.EagleData(ids=[torch.tensor(p + r) for p, r in zip(part.prompt_ids, part.response_ids)],
                    features=rec["hidden"], hidden=rec["hidden"], labels=[])
cfg = te.EagleTrainConfig(**json.loads(Path("/work/runs/eagle-own/run.json").read_text()))
head = te.reduced_rows(cfg, target, [own.response_ids[i] for i in range(len(own.response_ids) - 16)])
te.DenseAttention = probe.LayeredAttention
for extra, run in ((0, "/work/runs/eagle-scratch1"), (1, "/work/runs/eagle-scratch2")):
    probe.EXTRA_LAYERS = extra
    model = probe.init_predictor(target, 1, None, 6)
    model.load_state_dict(torch.load(Path(run) / "checkpoint.pt", weights_only=False)["params"])
    r = te.evaluate(model, target, data, list(range(64)), ttt_steps=2, head=head)
    print(run, extra, {k: round(v, 4) for k, v in r.items() if "top1" in k or "ce" in k or "regression" in k}, flush=True)
