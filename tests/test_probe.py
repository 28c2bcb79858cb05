"""Low-bit candidates timed on a slice before the whole model is packed (calibration/probe.py): the
slice shares the model's tensors and leaves it intact, a slice that loses by PROBE_PRUNE is
never packed whole, and the page says so; the packers give the same bits a few rows at a time."""
import pytest
import torch

from specviz.calibration import calibrate as cal
from specviz.calibration import probe
from specviz.engine.cpu import lowbit, qgemm
from specviz.models.tiny import tiny_model

VOCAB = 300


def test_a_slice_shares_the_first_layers_and_leaves_the_model_whole(monkeypatch):
    model = tiny_model(VOCAB, seed=0, layers=4, hidden=64)
    monkeypatch.setattr(probe, "SLICE_BYTES", 2 * probe._layer_bytes(model.model.layers[0]))
    monkeypatch.setattr(probe, "PROBE_HEAD", 100)
    part = probe.sliced(model)
    assert len(part.model.layers) == 2 and part.config.num_hidden_layers == 2
    assert all(a is b for a, b in zip(part.model.layers, model.model.layers[:2], strict=True))
    head = part.get_output_embeddings()
    assert head.weight.shape == (100, 64)
    assert head.weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    # the model itself: all its layers, its whole output layer, its config
    assert len(model.model.layers) == 4 and model.config.num_hidden_layers == 4
    assert model.get_output_embeddings().weight.shape == (VOCAB, 64)
    twin = lowbit.lowbit_copy(part, "w8")
    ids = torch.tensor([[5, 6, 7]])
    assert twin(input_ids=ids).logits.shape == (1, 3, 100)
    assert type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear  # packing the slice left it float


def test_a_trimmed_draft_slices_its_kept_rows():
    from specviz.models import vocab_trim
    model = tiny_model(VOCAB, seed=0, layers=4, hidden=64)
    vocab_trim.trim(model, list(range(0, VOCAB, 2)))
    probe.SLICE_BYTES, old = 1, probe.SLICE_BYTES
    try:
        part = probe.sliced(model)
    finally:
        probe.SLICE_BYTES = old
    assert len(part.model.layers) == 1 and part.get_output_embeddings().weight.shape == (150, 64)


def test_a_model_the_slice_would_cover_is_not_sliced():
    assert probe.sliced(tiny_model(VOCAB, seed=0, layers=2, hidden=64)) is None  # tiny: timed whole


def _fake_time(scores):
    """time(model, enough) from a format's per-shape seconds: shapes in order, stopping when enough."""
    def time(m, enough):
        out = {}
        for n in (1, 5, 64):
            out[n] = scores[lowbit.lowbit_format(m)] / 3
            if enough(out):
                break
        return out
    return time


def test_prune_keeps_near_candidates_and_bounds_the_ones_behind(monkeypatch):
    model = tiny_model(VOCAB, seed=0, layers=4, hidden=64)
    monkeypatch.setattr(probe, "SLICE_BYTES", 1)
    score = lambda t: sum(t.values())  # noqa: E731 - a partial timing is a lower bound
    cands = ["fp32", "w4", "w8", "w16"]
    left, said = probe.prune(model, cands, _fake_time({"w4": 1.0, "w8": 1.5, "w16": 3.3}), score)
    assert left == ["fp32", "w4", "w8"]  # fp32 is never sliced; w8 is within PROBE_PRUNE
    assert said["layers"] == 1 and set(said["pruned"]) == {"w16"}
    # w16 stopped once its bound passed 1.6 x 1.0: two of its three shapes, a ratio that is a bound
    assert said["partial"] == ["w16"] and said["pruned"]["w16"] == pytest.approx(2.2)
    assert probe.note("target", said) == " (target not timed whole: w16 >2.2x w4's time on 1 layers)"
    # a draft format that would compile is given the compile hope: 2.1 is past 1.6, 2.1 / 1.5 is not
    from specviz.calibration import draft_compile
    monkeypatch.setattr(draft_compile, "unwanted", lambda m: None if lowbit.lowbit_format(m) == "w16" else "no")
    times = _fake_time({"w4": 1.0, "w8": 1.5, "w16": 2.1})
    assert probe.prune(model, cands, times, score)[0] == ["fp32", "w4", "w8"]
    left, said = probe.prune(model, cands, times, score, hope=1.5)
    assert left == cands and not said["pruned"]
    # one low-bit candidate: nothing to compare
    assert probe.prune(model, ["fp32", "w4"], _fake_time({}), score) == (["fp32", "w4"], {})


def test_calibration_never_packs_a_format_whose_slice_loses(monkeypatch, tok):
    """End to end through calibrate: w16's slice is 3x w8's, so the whole model is packed in w8
    only (and timed whole, as before); the note names what the slices pruned."""
    monkeypatch.setattr(cal, "busy", lambda *a: False)
    monkeypatch.setattr(cal.lowbit, "available", lambda: ("w16", "w8"))
    monkeypatch.setattr(cal.lowbit, "row_exact", lambda: ("w16", "w8"))
    monkeypatch.setattr(probe, "SLICE_BYTES", 1)
    step = {None: 0.6, "w16": 0.3, "w8": 0.1}
    monkeypatch.setattr(cal, "time_forwards", lambda m, ns, **kw: {n: step[lowbit.lowbit_format(m)] for n in ns})
    packed, real_copy = [], lowbit.lowbit_copy
    monkeypatch.setattr(lowbit, "lowbit_copy", lambda m, fmt: packed.append(
        (fmt, m.config.num_hidden_layers)) or real_copy(m, fmt))
    t, _, choice = cal.calibrate(tiny_model(len(tok), seed=0, layers=3, hidden=64), None, native_bf16=False,
                                 min_params=0)
    assert choice.target == "w8" and lowbit.lowbit_format(t) == "w8"
    assert ("w16", 3) not in packed and ("w16", 1) in packed and ("w8", 3) in packed
    # fp32 is sliced too (calibrate passes make=): 6x behind, never timed whole
    assert set(choice.timings["target"]) == {"w8"}
    assert choice.timings["probe"]["target"]["pruned"] == {"fp32": pytest.approx(6.0), "w16": pytest.approx(3.0)}
    assert choice.note.endswith("(target not timed whole: w16 3.0x, fp32 6.0x w8's time on 1 layers)")


@pytest.mark.parametrize("pack", [qgemm.pack_q4, qgemm.pack_q8])
def test_packing_a_few_rows_at_a_time_gives_the_same_bits(monkeypatch, pack):
    torch.manual_seed(0)
    w = torch.randn(37, 352) * 0.05  # 11 blocks: an odd count, a short super-block
    whole = pack(w)
    monkeypatch.setattr(qgemm, "CHUNK", 5 * 352)  # 5 rows a chunk: 8 chunks, a short last one
    rows = qgemm.pack_rows(pack, w)
    assert rows.keys() == whole.keys()
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(whole.values(), rows.values(), strict=True))
