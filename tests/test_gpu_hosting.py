"""GPU placement and pair-by-memory logic on fake device lists (no GPU needed)."""
import pytest

from specviz.hosting.bandwidth import bandwidth_tbs, bound_line, bound_s, weight_bytes
from specviz.hosting.gpu import GB, GpuInfo, pick_pair, placement


def gpu(i, free_gb, name="NVIDIA H100 80GB HBM3", total_gb=80):
    return GpuInfo(i, name, int(total_gb * GB), int(free_gb * GB))


def test_no_gpu_is_cpu_fair():
    p = placement([])
    assert (p.baseline, p.speculative, p.default_mode) == ("cpu", "cpu", "fair")


def test_one_gpu_shares_the_device_and_stays_fair():
    p = placement([gpu(0, 70)])
    assert p.baseline == p.speculative == "cuda:0" and not p.separate
    assert p.default_mode == "fair"
    assert "share" in p.note and "stream" in p.note


def test_two_gpus_each_side_its_own():
    p = placement([gpu(0, 30), gpu(1, 70), gpu(2, 50)])
    assert p.separate and p.default_mode == "parallel"
    assert p.speculative == "cuda:1"  # most free memory: it holds target + draft
    assert p.baseline == "cuda:2"
    assert "true parallelism" in p.note


@pytest.mark.parametrize("devices, target", [
    ([], None),
    ([gpu(0, 15, "Tesla T4", 16)], None),  # too small for 7B: keep the default pair
    ([gpu(0, 22, "NVIDIA L4", 24)], "Qwen/Qwen2.5-Coder-7B-Instruct"),
    ([gpu(0, 39, "NVIDIA A100-PCIE-40GB", 40)], "Qwen/Qwen2.5-Coder-14B-Instruct"),
    ([gpu(0, 79)], "Qwen/Qwen2.5-Coder-32B-Instruct"),
    ([gpu(0, 50)], "Qwen/Qwen2.5-Coder-14B-Instruct"),  # an 80 GB card that is half busy
    ([gpu(0, 139, "NVIDIA H200", 141)], "Qwen/Qwen2.5-Coder-32B-Instruct"),
    # two GPUs: the pair must fit on both (baseline GPU holds the target, the other target + draft)
    ([gpu(0, 79), gpu(1, 39, "NVIDIA A100-PCIE-40GB", 40)], "Qwen/Qwen2.5-Coder-14B-Instruct"),
])
def test_pair_by_free_memory(devices, target):
    spec, why = pick_pair(devices)
    assert (spec.target if spec else None) == target
    assert why  # the page's pair note says why
    if spec:
        assert spec.draft == "Qwen/Qwen2.5-Coder-0.5B-Instruct" and "bf16" in why
    elif devices:
        assert "default" in why and "c ≈ 0.85" in why


@pytest.mark.parametrize("name, tbs", [
    ("NVIDIA H100 80GB HBM3", 3.35), ("NVIDIA H100 PCIe", 2.0), ("NVIDIA H200", 4.8),
    ("NVIDIA GH200 480GB", 4.0),
    ("NVIDIA A100-SXM4-80GB", 2.039), ("NVIDIA A100-PCIE-40GB", 1.555), ("NVIDIA L4", 0.3),
    ("NVIDIA L40S", 0.864), ("NVIDIA A10G", 0.6), ("Tesla T4", 0.32), ("Some New Accelerator", None),
    (None, None),
])
def test_bandwidth_table(name, tbs):
    assert bandwidth_tbs(name) == tbs


def test_bound_line(target):
    n = weight_bytes(target)
    assert n == sum(p.numel() * 4 for p in target.parameters()) + sum(b.numel() * b.element_size()
                                                                    for b in target.buffers())
    assert bound_s(3_350_000_000, "NVIDIA H100 80GB HBM3") == pytest.approx(1e-3)
    line = bound_line("target", 3_350_000_000, 4e-3, "NVIDIA H100 80GB HBM3")
    assert "limit 1.00 ms" in line and "25% of the bandwidth limit" in line
    assert "unknown" in bound_line("target", n, 1e-3, "Mystery GPU")


class _Loaded:
    def __init__(self, spec, device, draft):
        self.spec, self.device, self.has_draft = spec, device, draft


def _fake_load(spec, device=None, progress=None, load_draft=True, **kw):
    return _Loaded(spec, device, load_draft)


def test_host_loader_places_each_side():
    from specviz.hosting.gpu import host_loader
    from specviz.models import PAIRS
    spec = PAIRS["default"]
    two = host_loader({"default": "why this pair"}, devices=[gpu(0, 70), gpu(1, 60)], load=_fake_load)(spec)
    assert (two.device, two.has_draft) == ("cuda:0", True)
    assert (two.baseline_pair.device, two.baseline_pair.has_draft) == ("cuda:1", False)
    assert two.note.startswith("why this pair") and "true parallelism" in two.note
    one = host_loader(devices=[gpu(0, 70)], load=_fake_load)(spec)
    assert not hasattr(one, "baseline_pair") and "sharing" not in one.note and "share" in one.note
    cpu = host_loader(devices=[gpu(0, 70)], load=_fake_load)(spec, device="cpu")
    assert cpu.device == "cpu" and cpu.note == ""


def test_host_default_pair():
    from specviz.hosting.gpu import host_default
    assert host_default("cpu", devices=[gpu(0, 79)]) == (None, "")
    assert host_default(None, devices=[]) == (None, "")
    spec, why = host_default(None, devices=[gpu(0, 79)])
    assert spec.target.endswith("32B-Instruct") and "bf16" in why


@pytest.mark.parametrize("mode", ["fair", "parallel"])
def test_race_runs_the_baseline_on_its_own_pair(mode, tok, target, draft):
    """Two pairs stand in for two GPUs: the baseline side must run on baseline_pair."""
    import copy

    from specviz.engine.events import RunSummary
    from specviz.models import ModelPair, PairSpec
    from specviz.run.race import race
    from specviz.run.request import make_request
    spec = PairSpec("t", "t", "d", "t", True)
    pair = ModelPair(target, draft, tok, spec, target.device, target.dtype, [0])
    other = copy.deepcopy(target)
    calls = []
    hook = other.register_forward_hook(lambda *a: calls.append(1))
    pair.baseline_pair = ModelPair(other, None, tok, spec, other.device, other.dtype, [0])
    req = make_request("def f(x):", method="draft", gamma=3, max_new_tokens=10, temperature=0.0)
    ids = tok.encode(req.prompt)
    sums = {s: ev for s, ev in race(pair, req, ids, mode) if isinstance(ev, RunSummary)}
    hook.remove()
    assert len(calls) == sums["baseline"].target_forwards > 0  # every baseline forward ran on its own copy
    assert sums["baseline"].token_ids == sums["speculative"].token_ids
