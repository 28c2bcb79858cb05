"""A GPU's 16-bit type from its compute capability, and the fp16 overflow guard, with fake
devices and a fake model that overflows in fp16 (no GPU here)."""
from types import SimpleNamespace

import pytest
import torch

from specviz import machine
from specviz.calibration.handoff import Loaded
from specviz.hosting.gpu import host_loader
from specviz.models import ModelPair, PairSpec, loading, overflow
from specviz.models.registry import pick_device_dtype
from specviz.ui.glossary import pair_html


@pytest.mark.parametrize("cap, half", [((7, 5), "fp16"), ((7, 0), "fp16"), ((6, 1), "fp16"),
                                       ((8, 0), "bf16"), ((8, 6), "bf16"), ((8, 9), "bf16"), ((9, 0), "bf16")])
def test_half_type_from_the_compute_capability(cap, half):
    assert machine.half_for_capability(cap) == half


@pytest.mark.parametrize("name, cap, want", [("Tesla T4", (7, 5), torch.float16),
                                             ("Tesla V100-SXM2-16GB", (7, 0), torch.float16),
                                             ("NVIDIA A100-SXM4-80GB", (8, 0), torch.bfloat16),
                                             ("NVIDIA L4", (8, 9), torch.bfloat16),
                                             ("NVIDIA H100 80GB HBM3", (9, 0), torch.bfloat16)])
def test_the_app_picks_the_type_by_capability_not_by_is_bf16_supported(monkeypatch, name, cap, want):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    # a T4 says True here through emulation (pytorch#148322): it must not decide
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    dev, dtype = pick_device_dtype("cuda")
    assert dev.type == "cuda" and dtype == want
    assert pick_device_dtype(None)[1] == want  # auto on a GPU host


class Overflowing(torch.nn.Module):
    """A model whose logits are 90,000: beyond fp16's largest finite value (65,504), fine in fp32."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((3,), 1.0, dtype=dtype), requires_grad=False)

    def forward(self, input_ids, use_cache=False):
        big = self.w.sum() * 30000
        return SimpleNamespace(logits=big * torch.ones(1, input_ids.shape[1], 5, dtype=self.w.dtype))


class Fine(Overflowing):
    def forward(self, input_ids, use_cache=False):
        return SimpleNamespace(logits=self.w.sum() * torch.ones(1, input_ids.shape[1], 5, dtype=self.w.dtype))


def test_fp16_overflow_falls_back_to_fp32_reloaded():
    target, draft = Overflowing(torch.float16), Fine(torch.float16)
    assert not overflow.finite_logits(target, [1, 2, 3]) and overflow.finite_logits(draft, [1, 2, 3])
    reloaded = []
    reload = Loaded(lambda: reloaded.append("t") or Overflowing(), lambda: reloaded.append("d") or Fine())
    t, d, why = overflow.guard(target, draft, [1, 2, 3], reload)
    assert reloaded == ["t", "d"]  # the originals from disk, not the fp16 weights widened
    assert overflow.dtype_of(t) == overflow.dtype_of(d) == torch.float32
    assert overflow.finite_logits(t, [1, 2, 3])
    assert "float16" in why and "target" in why and "not finite" in why and "float32" in why


def test_no_overflow_changes_nothing_and_bf16_is_checked_too():
    t, d = Fine(torch.float16), Fine(torch.bfloat16)
    assert overflow.guard(t, d, [1, 2], None) == (t, d, "")
    t2, _, why = overflow.guard(Overflowing(torch.bfloat16), None, [1, 2], None)  # 90,000 is finite in bf16
    assert why == "" and overflow.dtype_of(t2) == torch.bfloat16
    t3, d3, why = overflow.guard(Overflowing(torch.float16), None, [1, 2], None)  # no reload: widened in place
    assert d3 is None and overflow.dtype_of(t3) == torch.float32 and why


def test_the_load_wiring_guards_on_a_gpu_only(tok):
    t = Overflowing(torch.float16)
    assert loading._guard(t, None, torch.device("cpu"), tok, None, None) == (t, None, "")
    t2, _, why = loading._guard(t, None, torch.device("cuda"), tok, None, None)  # the models' own device
    assert overflow.dtype_of(t2) == torch.float32 and "overflow" in why


def test_the_page_says_why(tok):
    t, d, why = overflow.guard(Overflowing(torch.float16), Fine(torch.float16), [1, 2], None)
    spec = PairSpec("default", "t", "d", "Qwen2.5-Coder 1.5B + 0.5B", False)
    pair = ModelPair(t, d, tok, spec, torch.device("cpu"), torch.float16, [0], "float16",
                     precision_note="on a GPU the half type is the natural choice")
    overflow.mark(pair, why)
    assert pair.dtype == torch.float32 and pair.precision_label == "float32"
    assert pair.precision_note.startswith("float32, not float16")
    # the pair's loader (hosting/gpu.py) keeps the note, and the page keeps it in sight
    pair2 = host_loader(devices=[], load=lambda spec, **kw: pair)(spec)
    assert why in pair2.note
    html = pair_html({"label": spec.label, "device": "cuda:0", "precision": pair.precision_label,
                      "precision_note": pair.precision_note, "note": pair2.note})
    assert "sv-pair-note" in html and "were not finite" in html and "float32" in html
