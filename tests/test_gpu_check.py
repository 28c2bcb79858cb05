"""`python -m specviz gpu-check`: its CPU mode (tiny shapes, the same code) runs here so that the
prepared GPU command cannot rot; without CUDA it exits with one line; it never imports gradio."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import copy_into

from specviz.cli import gpu_check
from specviz.engine.gpu import measure
from specviz.run import gpu_page

ROOT = Path(__file__).resolve().parents[1]
# what a bare GPU machine lacks: importing any of them fails in the child
BLOCK = "import sys\nfor m in ('gradio', 'plotly', 'kaleido', 'gguf', 'psutil'):\n    sys.modules[m] = None\n"


def run_main(args, tmp_path):
    code = BLOCK + f"import runpy\nsys.argv = ['specviz'] + {args!r}\nrunpy.run_module('specviz', run_name='__main__')\n"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
                               "HF_HUB_OFFLINE": "1", "SPECVIZ_CACHE": str(tmp_path / "cache")})


def test_cpu_tiny_runs_the_whole_check_without_gradio(tmp_path):
    out = tmp_path / "check.json"
    res = run_main(["gpu-check", "--cpu-tiny", "--new-tokens", "12", "--prompt-len", "8", "--out", str(out)],
                   tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "CPU, tiny shapes" in res.stdout and "skipped" in res.stdout
    r = json.loads(out.read_text())
    env = r["environment"]
    assert env["mode"] == "cpu-tiny" and any("CUDA graphs" in s for s in env["skipped"])
    assert list(r["dtypes"]) == ["bf16"]
    d = r["dtypes"]["bf16"]
    for side in ("target", "draft"):
        assert d[side]["finite_logits"] and d[side]["step_eager_ms"] > 0 and d[side]["step_static_eager_ms"] > 0
        assert "step_graph_ms" not in d[side]  # CUDA only
    assert sorted(int(k) for k in d["v"]["v"]) == list(range(1, 17))
    for side in ("target", "draft"):  # where a step's time goes: its kernels (CPU: its ops) by kind
        c = d["census"][side]
        assert c["kernels"] > 0 and c["kernel_ms"] > 0 and sum(k["kernels"] for k in c["by_kind"].values()) > 0
        assert "gemm" in c["by_kind"] and c["step_ms"] > 0
    assert "census target:" in res.stdout
    names = [k for k, _ in r["section_s"]]  # each section's seconds, in the order run
    assert names[:3] == ["target", "draft", "fusion"] and "page" in names and all(t >= 0 for _, t in r["section_s"])
    assert d["spec_self"]["identical"] and d["spec_self"]["alpha"] == 1.0
    assert d["spec_truncated"]["identical"] and d["spec_truncated"]["draft_layers"] == 1
    assert d["race"]["identical_to_alone"] and "bandwidth" not in r  # the scheduler runs on a CPU too
    assert d["page"]["self"]["identical"] and d["page_parallel"]["same_tokens_as_fair"]
    trees = d["page"]["trees"]  # eager beside the graphs, each run and equal to plain
    assert set(trees) == set(gpu_page.TREES) and all(t.get("identical") for t in trees.values()), trees
    assert "page trees: tree identical" in res.stdout
    assert "bare" in d["eager_ways"]["step_ms"] and "compiled" not in d and "big" not in d  # CUDA only
    v = r["verdict"]["bf16"]
    assert v["graph_step_le_2x_floor"] is None and v["race_identical"] is True


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_one_line_and_exit_3(tmp_path):
    res = run_main(["gpu-check", "--out", str(tmp_path / "x.json")], tmp_path)
    assert res.returncode == gpu_check.NO_CUDA == 3
    assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1
    assert "no CUDA device" in res.stderr and not (tmp_path / "x.json").exists()


def test_the_configs_are_the_default_pairs_architectures():
    t, d = measure.config(measure.TARGET_CONFIG), measure.config(measure.DRAFT_CONFIG)
    assert (t.model_type, t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads,
            t.intermediate_size, t.vocab_size) == ("qwen2", 1536, 28, 12, 2, 8960, 151936)
    assert (d.hidden_size, d.num_hidden_layers, d.num_attention_heads, d.intermediate_size) == (896, 24, 14, 4864)
    for name in (measure.TARGET_CONFIG, measure.DRAFT_CONFIG):
        assert (measure.CONFIGS / name).stat().st_size < 8192  # a few KB each


def test_random_models_are_seeded():
    a = measure.build(measure.DRAFT_CONFIG, "cpu", torch.float32, seed=1, tiny=True)
    b = measure.build(measure.DRAFT_CONFIG, "cpu", torch.float32, seed=1, tiny=True)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def fake_gpu_result():
    side = lambda ms, floor: {"params": 1.5e9, "weight_bytes": 3e9, "finite_logits": True,  # noqa: E731
                              "step_eager_ms": 25.0, "step_static_eager_ms": 20.0, "step_graph_ms": ms,
                              "floor_ms": floor, "step_over_floor": ms / floor}
    r = {"target": side(2.0, 1.2), "draft": side(0.8, 0.4)}
    r["c"] = gpu_check.c_values(r)
    r["v"] = {"v": {k: 1 + k / 100 for k in range(1, 17)}}
    r["spec_self"] = {"identical": True, "first_difference": None, "alpha": 1.0, "tokens_per_round": 5.0,
                      "speedup": 3.0}
    r["race"] = {"interference": {"baseline": 1.4, "speculative": 1.3}}
    res = {"environment": {"name": "NVIDIA H100 80GB HBM3", "torch": "2.11", "transformers": "5.17",
                           "mode": "cuda", "capability": [9, 0], "half_type": "bf16"},
           "bandwidth": {"copy_gbs": 2500.0}, "dtypes": {"bf16": r}, "seconds": 120}
    res["verdict"] = gpu_check.verdict(res)
    return res


def test_verdict_and_summary_of_a_gpu_result():
    res = fake_gpu_result()
    assert res["dtypes"]["bf16"]["c"]["graph"] == pytest.approx(0.4)
    v = res["verdict"]["bf16"]
    assert v["graph_step_le_2x_floor"] is True and v["c_graph_le_half"] is True
    assert v["compiled_step_le_2x_floor"] is None and v["page_plain_ge_150_tok_s"] is None  # not measured
    text = "\n".join(gpu_check.summary(res))
    assert len(text.splitlines()) <= 24  # one screen
    for want in ("sm 9.0", "half type bf16", "2500 GB/s", "graphs 2.00", "(1.67x)", "graph 0.40",
                 "16:1.16", "identical", "race: together ÷ alone baseline 1.40"):
        assert want in text, want


# ------------------------------------------------- the CUDA-only code, on a CPU under fake CUDA calls
# Graph capture, streams and events cannot run here; faking them runs every line of the sections
# the GPU day will run (graphs replayed through their input buffers, the race's threads), so that
# day finds measurements, not a typo.


class FakeGraph:
    """A captured forward: replay() recomputes it from the (updated) input buffers into the same output."""

    replays = 0

    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        FakeGraph.replays += 1
        copy_into(self.out, self.fn())


class FakeEvent:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        import time
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


class FakeStream:
    def __init__(self, device=None):
        pass

    def wait_stream(self, other):
        pass


@pytest.fixture()
def fake_cuda(monkeypatch):
    import contextlib

    from specviz.engine.gpu import static

    def capture(fn, device, warmup=2, stream=None, pool=None):
        for _ in range(warmup):
            fn()
        out = fn()
        return FakeGraph(fn, out), out

    FakeGraph.replays = 0
    monkeypatch.setattr(static, "capture_graph", capture)
    for name, value in (("Stream", FakeStream), ("Event", FakeEvent), ("stream", lambda s: contextlib.nullcontext()),
                        ("synchronize", lambda *a, **k: None), ("empty_cache", lambda: None),
                        ("get_device_capability", lambda d=None: (9, 0)),
                        ("get_device_name", lambda d=None: "Fake H100")):
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setitem(measure.TIMING, "calls", 1)
    monkeypatch.setitem(measure.TIMING, "repeats", 1)
    monkeypatch.setitem(measure.TIMING, "warmup", 0)
    return FakeGraph


def test_replayed_graphs_give_plain_greedy(fake_cuda):
    """The loop with graphs on (fake replays through the input buffers) equals the eager loop."""
    from specviz.engine.gpu.graphs import cache_len, plain_greedy, speculative_greedy
    from specviz.engine.gpu.static import StaticModel
    t = measure.build(measure.TARGET_CONFIG, "cpu", torch.float32, tiny=True)
    prompt, new = measure.prompt_ids(12, t.config.vocab_size), 30
    n = cache_len(len(prompt), new, 4)
    ref = plain_greedy(StaticModel(t, n, graphs=False), prompt, new)
    assert plain_greedy(StaticModel(t, n, graphs=True), prompt, new) == ref
    for layers in (None, 1):
        assert speculative_greedy(StaticModel(t, n, graphs=True), StaticModel(t, n, n_layers=layers, graphs=True),
                                  prompt, new, 4).tokens == ref
    assert fake_cuda.replays > new


def test_every_gpu_section_runs_under_fake_cuda(fake_cuda, monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check, "RACE_STEPS", 10)
    monkeypatch.setattr(gpu_check, "COPY_MIB", 4)
    args = gpu_check._args(["--cpu-tiny", "--out", str(tmp_path / "c.json"), "--dtypes", "fp32", "--no-big",
                            "--no-compile", "--new-tokens", "12", "--prompt-len", "8"])
    res = gpu_check.Check(args, torch, torch.device("cpu"), gpu=True).run()
    errors = {k: v for k, v in res["dtypes"]["fp32"].items() if isinstance(v, dict) and "error" in v}
    assert not errors and "error" not in res["bandwidth"]
    d = res["dtypes"]["fp32"]
    for side in ("target", "draft"):
        assert d[side]["step_graph_ms"] > 0 and d[side]["floor_ms"] > 0 and d[side]["step_over_floor"] > 0
    assert set(d["c"]) == {"eager", "static_eager", "graph"} and d["v"]["how"] == "graph replays"
    assert d["spec_self"]["identical"] and d["spec_truncated"]["identical"]
    race = d["race"]
    assert set(race["interference"]) == {"baseline", "speculative"} and race["identical_to_alone"]
    assert all(v > 0 for v in race["interference"].values())
    assert res["environment"]["capability"] == [9, 0] and res["environment"]["half_type"] == "bf16"
    assert res["verdict"]["fp32"]["c_graph_le_half"] is not None
    assert json.loads((tmp_path / "c.json").read_text())["verdict"] == res["verdict"]
    assert len(gpu_check.summary(res)) <= 30


def test_a_greedy_difference_is_exit_1():
    res = fake_gpu_result()
    assert not gpu_check.differs(res)
    res["dtypes"]["bf16"]["spec_truncated"] = {"identical": False, "first_difference": 7}
    assert gpu_check.differs(res) and gpu_check.DIFFERENT == 1


def test_the_cards_own_half_type_goes_first():
    args = gpu_check._args([])
    assert gpu_check.dtype_order(args, "bf16") == ["bf16", "fp16"]  # A100, L4, H100
    assert gpu_check.dtype_order(args, "fp16") == ["fp16", "bf16"]  # T4, V100
    assert gpu_check.dtype_order(gpu_check._args(["--cpu-tiny"]), None) == ["bf16"]
    assert gpu_check.dtype_order(gpu_check._args(["--dtypes", "fp32, fp16"]), "bf16") == ["fp32", "fp16"]


def test_listed_with_the_tools():
    from specviz.cli.main import TOOLS, build_parser
    assert TOOLS["gpu-check"][0] == "specviz.cli.gpu_check"
    assert "gpu-check" in build_parser().format_help()


def test_the_summary_says_whether_a_page_parting_is_a_tie():
    from specviz.cli.gpu_check import _parting
    assert "(a tie)" in _parting({"first_difference": 47, "logit_gap_at_difference": {"gap": 0.0, "type_eps": 0.025}})
    assert "NOT A TIE" in _parting({"first_difference": 3, "logit_gap_at_difference": {"gap": 1.5, "type_eps": 0.02}})
    assert _parting({"first_difference": None}) == ""
