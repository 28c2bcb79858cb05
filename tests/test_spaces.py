"""A simulated Hugging Face Space: SPACE_ID set, the embedded GGUF packages
invisible, a local folder standing in for the Hub cache (HF_HUB_OFFLINE=1).
The app must start on the Hub pair the README preloads, and a run must work."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from specviz.hosting import spaces
from specviz.models.tiny import save_tiny_pair

ROOT = Path(__file__).resolve().parents[1]


def front_matter() -> dict:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_front_matter_parses_and_preloads_what_the_app_loads():
    fm = front_matter()
    assert fm["sdk"] == "gradio" and fm["app_file"] == "app.py"
    preload = [entry.split()[0] for entry in fm["preload_from_hub"]]
    assert set(preload) == {spaces.HUB_DEFAULT.target, spaces.HUB_DEFAULT.draft}
    timeout = str(fm["startup_duration_timeout"])
    minutes = int(timeout[:-1]) * (60 if timeout.endswith("h") else 1)
    assert timeout[-1] in "mh" and minutes >= 30  # a cold start loads two models


def hub_cache(root: Path) -> Path:
    """Tiny models saved under the Hub cache's snapshot layout."""
    tiny = root / "tiny"
    dirs = dict(zip((spaces.HUB_TARGET, spaces.HUB_DRAFT), save_tiny_pair(tiny), strict=True))
    cache = root / "hub"
    for repo, src in dirs.items():
        top = cache / ("models--" + repo.replace("/", "--"))
        snap = top / "snapshots" / ("0123abcd" * 5)
        snap.mkdir(parents=True)
        for f in Path(src).iterdir():
            (snap / f.name).write_bytes(f.read_bytes())
        (top / "refs").mkdir()
        (top / "refs" / "main").write_text(snap.name)
    return cache


SCRIPT = textwrap.dedent("""
    import json, sys
    import specviz.models.embedded as e
    e.packages_installed = lambda name: False   # the Space never installed requirements-models.txt
    import app
    from specviz.run.race import race
    from specviz.run.request import encode_prompt, make_request
    from specviz.engine.events import RunSummary
    args = app.build_parser().parse_args(["--device", "cpu", "--quantize", "none"])
    demo, manager = app.create_app(args)
    assert manager.wait(120), manager.status()
    pair = manager.pair
    req = make_request("def f(x):", method="draft", gamma=3, max_new_tokens=12, temperature=0.0)
    ids = encode_prompt(pair.tokenizer, req)
    sums = {s: ev for s, ev in race(pair, req, ids, "fair") if isinstance(ev, RunSummary)}
    print(json.dumps({"target": pair.spec.target, "draft": pair.spec.draft, "label": pair.spec.label,
                      "tokens": {s: v.token_ids for s, v in sums.items()}}))
""")


@pytest.fixture()
def space_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(SPACE_ID="someone/specviz", HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(hub_cache(tmp_path)),
               SPECVIZ_CACHE=str(tmp_path / "no-converted-cache"), PYTHONPATH=str(ROOT))
    return env


def test_space_without_embedded_packages_starts_on_the_hub_pair_and_runs(space_env):
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=space_env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert (res["target"], res["draft"]) == (spaces.HUB_TARGET, spaces.HUB_DRAFT)
    assert "Hub" in res["label"]
    base, spec = res["tokens"]["baseline"], res["tokens"]["speculative"]
    assert len(base) == 12 and spec == base  # greedy: the same text on both sides


def test_default_pair_choice(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert spaces.default_pair().target.startswith("embedded:")  # not a Space: always the embedded pair
    monkeypatch.setenv("SPACE_ID", "someone/specviz")
    monkeypatch.setattr(spaces, "embedded_available", lambda: True)
    assert spaces.default_pair().target.startswith("embedded:")  # a Space that has the packages
    monkeypatch.setattr(spaces, "embedded_available", lambda: False)
    assert spaces.default_pair() is spaces.HUB_DEFAULT


def test_zerogpu_duration_follows_the_run_limits(monkeypatch):
    from specviz.run.request import Limits
    assert spaces.zerogpu_seconds(16, 300) < spaces.zerogpu_seconds(512, 300)
    assert spaces.zerogpu_seconds(512, 30) == 30 + spaces.ZEROGPU_OVERHEAD_S  # capped by max-seconds
    assert spaces.zerogpu_seconds(10**6, 10**6) == spaces.ZEROGPU_MAX_S
    assert spaces.zerogpu_seconds("junk", 300) > 0  # bad input is refused later, with a message

    seen = {}

    class FakeSpaces:  # the `spaces` package of a ZeroGPU Space
        @staticmethod
        def GPU(duration=60):
            def wrap(fn):
                def run(*a, **kw):
                    seen["duration"] = duration(*a, **kw) if callable(duration) else duration
                    return fn(*a, **kw)
                return run
            return wrap

    monkeypatch.setitem(sys.modules, "spaces", FakeSpaces)
    lim = Limits(max_new_tokens=512, max_prompt_tokens=2048, max_seconds=120.0)
    run = spaces.gpu_decorator(lim, max_tokens_arg=2)(lambda prompt, gamma, n: n)
    assert run("p", 4, 40) == 40
    assert seen["duration"] == spaces.zerogpu_seconds(40, 120.0)
    run("p", 4, 1000)
    assert seen["duration"] == spaces.zerogpu_seconds(1000, 120.0) == 120 + spaces.ZEROGPU_OVERHEAD_S
