"""early-exit's trained exit (engine/trained/exit_head.py, heads/exit_train.py) on tiny fp32 models: a short
training on a tiny pass lowers the loss and reports held-out agreement trained and untrained; the file is
found, its layer chosen, the run header says the exit is trained; greedy output stays plain's and drafts
come from the kept tokens only; sampled sequences follow the target's law."""
import pytest
import torch
from helpers import follows_target, run
from test_eagle import GREEDY, PROMPT, _tiny_data, pair_of
from test_eagle import one_thread as one_thread  # autouse: a scratch cache, no shipped files, one thread

from specviz.calibration.selfspec import pending, resolve_options
from specviz.engine.decoding import baseline, speculative
from specviz.engine.proposers import make_proposer
from specviz.engine.proposers.early_exit import SharedCacheExitProposer
from specviz.engine.sampling import SamplingParams
from specviz.engine.trained import store
from specviz.engine.trained.eagle_head import KeptHead
from specviz.engine.trained.exit_head import ExitAdapter, TrainedExit, config_of
from specviz.heads import features
from specviz.models.tiny import tiny_model
from specviz.ui.method_options import TRAINED_EXIT, setup_text


def test_training_on_the_pass_and_the_trained_run(target, tok, tmp_path):
    from specviz.heads.exit_train import train_exit
    convs, docs = _tiny_data()
    features.run_pass(target, tok, tmp_path / "p", 3000, seq=64, convs=convs, docs=docs, log=None)
    pair = pair_of(target, tok)
    blob, rep = train_exit(pair, tmp_path / "p", layer=1, minutes=2, lr=3e-3, intermediate=64, batch=64,
                           steps=80)
    assert rep["stopped_by"] == "steps" and rep["loss_last"][1] < rep["loss_first"][1]
    agree = rep["held_out_first_draft_agreement"]
    assert agree["rows"] > 0 and set(agree["code"]) == {"trained", "untrained"}
    assert (tmp_path / "p" / "exit-L1.pt").is_file()  # the layer-1 states, kept for a resumed run
    store.save(pair, "exit", blob, rep)
    options = resolve_options(pair, "early-exit", {})
    assert options["exit_layer"] == 1 and options["trained"] is True and pending(pair, "early-exit", {}) is None
    assert TRAINED_EXIT in setup_text("early-exit", options)
    off = resolve_options(pair, "early-exit", {"trained": False, "exit_layer": 2})
    assert off["trained"] is False and TRAINED_EXIT not in setup_text("early-exit", off)
    ids = tok.encode(PROMPT)
    _, base = run(baseline(target, tok, ids, 24, GREEDY))
    req = type("R", (), {"options": options})()
    prop = make_proposer(pair, "early-exit", req)
    assert prop.exit_head is not None and prop.exit_head.layer == 1
    rounds, spec = run(speculative(target, prop, tok, ids, 24, 3, GREEDY))
    assert spec.token_ids == base.token_ids and spec.drafted > 0
    keep = set(blob["keep"].tolist())
    assert all(d in keep for r in rounds for d in r.draft_ids)


def random_exit(t, layer: int, keep=None, seed: int = 2) -> TrainedExit:
    torch.manual_seed(seed)
    a = ExitAdapter(config_of(t, layer, 16))
    for p in a.parameters():
        torch.nn.init.normal_(p, std=0.4)
    v = t.config.vocab_size
    keep = torch.arange(v) if keep is None else keep
    return TrainedExit(a.eval(), KeptHead(t.lm_head.weight, keep, v, None)).eval()


@pytest.mark.parametrize("params,gamma", [(SamplingParams(temperature=1.0), 2)])
def test_sampled_sequences_follow_the_target(params, gamma):
    t = tiny_model(4, seed=10, layers=2, init=0.8)
    head = random_exit(t, 1)
    assert follows_target(t, lambda: SharedCacheExitProposer(t, 1, vocab_size=4, exit_head=head),
                          [1, 2, 3, 1, 2], 4, gamma, params, 1200) > 1e-3
