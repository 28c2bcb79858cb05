"""`python -m specviz gpu-check`: its CPU mode (tiny shapes, the same code) runs here so that the
prepared GPU command cannot rot; without CUDA it exits with one line; it never imports gradio."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specviz.cli import gpu_check
from specviz.engine.gpu import measure

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
    res = run_main(["gpu-check", "--cpu-tiny", "--out", str(out)], tmp_path)
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
    assert d["spec_self"]["identical"] and d["spec_self"]["alpha"] == 1.0
    assert d["spec_truncated"]["identical"] and d["spec_truncated"]["draft_layers"] == 1
    assert "race" not in d and "bandwidth" not in r
    assert r["verdict"]["bf16"] == {"step_le_2x_floor": None, "c_le_half": None}


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
    assert res["verdict"]["bf16"] == {"step_le_2x_floor": True, "c_le_half": True}
    text = "\n".join(gpu_check.summary(res))
    assert len(text.splitlines()) <= 24  # one screen
    for want in ("sm 9.0", "half type bf16", "2500 GB/s", "graphs 2.00", "(1.67x)", "graph 0.40",
                 "16:1.16", "identical", "race: together ÷ alone baseline 1.40"):
        assert want in text, want
