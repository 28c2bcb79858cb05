"""bench.headline: per-prompt pairing with plain, best-γ choice, spread (no models)."""
import csv

from specviz.bench.headline import bootstrap_median, headline, load_runs, main
from specviz.bench.runs import RUN_COLUMNS

# (variant, tokens/s on prompt p0, p1, p2): plain is 10 everywhere
SPEEDS = {"plain": (10, 10, 10), "draft:2": (15, 16, 17), "draft:4": (20, 18, 22),
          "draft:auto": (19, 19, 19), "hf-assisted:2": (14, 14, 14), "hf-assisted:4": (16, 15, 17),
          "hf-heuristic": (18, 18, 18)}


def _write(path):
    with open(path / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, RUN_COLUMNS)
        w.writeheader()
        for variant, speeds in SPEEDS.items():
            fam = variant.split(":")[0]
            for i, s in enumerate(speeds):
                w.writerow({"variant": variant, "family": fam, "task": "code", "prompt_id": f"p{i}",
                            "repeat": 0, "tokens_per_s": s, "decode_tokens_per_s": s,
                            "predicted_v": 2.0 if fam == "draft" else ""})


def test_headline_pairs_prompts_and_picks_best(tmp_path):
    _write(tmp_path)
    h = headline(load_runs([str(tmp_path)]))
    same = h["same_gamma"]["code"]
    assert same["draft:4"]["median"] == 2.0 and same["draft:4"]["min"] == 1.8
    assert same["hf-assisted:4"]["max"] == 1.7
    best = h["best_gamma"]["code"]
    assert set(best) == {"draft:4", "hf-heuristic"}  # heuristic beats HF's constant γ here
    assert h["auto"]["code"]["median"] == 1.9
    assert abs(h["ours_over_hf"]["code"]["median"] - 2.0 / 1.8) < 1e-9
    assert h["measured_over_predicted"]["4"]["median"] == 1.0
    assert h["same_gamma"]["all"]["draft:4"]["n"] == 3


def test_bootstrap_interval_contains_median():
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    lo, hi = bootstrap_median(xs)
    assert lo <= 3.0 <= hi and 1.0 <= lo and hi <= 5.0


def test_cli_writes_json(tmp_path, capsys):
    _write(tmp_path)
    assert main([str(tmp_path), "--json", str(tmp_path / "h.json")]) == 0
    assert "(b) each family" in capsys.readouterr().out
    assert (tmp_path / "h.json").exists()
