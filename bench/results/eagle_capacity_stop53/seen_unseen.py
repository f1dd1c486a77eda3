"""Seen vs unseen agreement of the shipped EAGLE head on ShareGPT answers of the same corpus (64 sequences each).

`unseen_eval.py` reads the same picks through `answer_sets`, `eval_data` and `reduced_head`."""
import sys, json, random, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
from pathlib import Path
from specdec.models.loader import load_model
from specdec.training import eagle as te
from specdec.training.common import load_corpus, read_corpus, Corpus
from specdec.drafters.heads.eagle_checkpoint import load_eagle


def answer_sets(loaded, verbose=False):
    """The run's corpus, the corpus records, and 64 picks of answers the run trained on and 64 it never saw."""
    own = load_corpus(Path("/work/runs/own_corpus.pt"))
    store = read_corpus(str(Path("~/.cache/specdec/corpora/smollm2-135m").expanduser()), loaded)
    used = {tuple(p) for p in own.prompt_ids}
    pairs = list(zip(store.prompt_ids, store.response_ids))
    seen = [i for i in range(len(pairs)) if tuple(pairs[i][0]) in used][:2000]
    unseen = [i for i in range(len(pairs) * 6 // 10, len(pairs)) if tuple(pairs[i][0]) not in used]
    if verbose:
        print("records", len(pairs), "seen", len(seen), "unseen candidates", len(unseen))
    rng = random.Random(0)
    pick_seen = rng.sample(seen, 64)
    return own, pairs, pick_seen, rng.sample(unseen, 64)


def eval_data(target, pairs, idx):
    """The target's features (bf16 pass) over the picked records, as the trainer holds them."""
    part = Corpus([pairs[i][0] for i in idx], [pairs[i][1] for i in idx])
    rec = te.record(target, part, 1, True)
    ids = [torch.tensor(p + r) for p, r in zip(part.prompt_ids, part.response_ids)]
    return te.EagleData(ids=ids, features=rec["hidden"], hidden=rec["hidden"], labels=[])


def reduced_head(target, own):
    """The run's 4,096-token head rows, chosen from its training answers as the trainer chose them."""
    cfg = te.EagleTrainConfig(**json.loads(Path("/work/runs/eagle-own/run.json").read_text()))
    return te.reduced_rows(cfg, target, [own.response_ids[i] for i in range(len(own.response_ids) - 16)])


if __name__ == "__main__":
    torch.set_num_threads(1)
    heads = sys.argv[1:] or ["specdec/assets/eagle/smollm2-135m"]
    loaded = load_model("smollm2-135m", "cpu", "float32", show_progress=False)
    target = loaded.model
    own, pairs, pick_seen, pick_unseen = answer_sets(loaded, verbose=True)
    data = eval_data(target, pairs, pick_seen + pick_unseen)
    head = reduced_head(target, own)
    for h in heads:
        model, _ = load_eagle(Path(h), target.config, "cpu", torch.float32)
        for name, sel in (("seen", list(range(64))), ("unseen", list(range(64, 128)))):
            r = te.evaluate(model, target, data, sel, ttt_steps=2, head=head)
            print(h, name, {k: round(v, 4) for k, v in r.items() if "top1" in k}, flush=True)
