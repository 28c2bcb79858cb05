import contextlib
import os

import pytest
import torch

from specviz.models.tiny import tiny_model, tiny_tokenizer


def pytest_collection_finish(session):
    """Every test module imported: what exists now goes out of the cycle collector's walk, as app.py
    does before its first model (engine/cpu/memory.py freeze_imports). Without it every full
    collection walked the whole worker: a process running one test with four tiny calibrations
    spent 15.2 s in the collector, 5.1 s with it (2026-11-26)."""
    from specviz.engine.cpu.memory import freeze_imports
    freeze_imports()


@pytest.fixture(scope="session")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def target(tok):
    return tiny_model(len(tok), seed=0, layers=3)


@pytest.fixture(scope="session")
def draft(tok):
    return tiny_model(len(tok), seed=1, layers=1)


@pytest.fixture(scope="session")
def peaked(tok):
    """A target with peaked laws and a close draft (its output layer perturbed:
    top-1 agrees ~3/4 of the time, top-3 ~9/10): trees grow deep paths and the
    second and third children matter."""
    t = tiny_model(len(tok), seed=0, layers=3, init=0.8)
    d = tiny_model(len(tok), seed=0, layers=3, init=0.8)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        d.lm_head.weight.add_(torch.randn(d.lm_head.weight.shape, generator=g) * 0.16)
    return t, d


@pytest.fixture(scope="session")
def pair_dirs(tmp_path_factory):
    """The tiny pair saved as two model folders (target, draft), for the command lines."""
    from specviz.models.tiny import save_tiny_pair
    return save_tiny_pair(tmp_path_factory.mktemp("tiny-pair"))


@pytest.fixture(scope="session")
def other_vocab_dir(tmp_path_factory):
    """A model whose tokenizer differs from the tiny pair's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    d = tmp_path_factory.mktemp("other-vocab")
    vocab = {"<eos>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate("abcdefgh")}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<eos>").save_pretrained(d)
    tiny_model(16, seed=3, layers=1).save_pretrained(d)
    return str(d)


@contextlib.contextmanager
def _torch_threads(n: int):
    import torch
    was = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(was)


@pytest.fixture(autouse=True)
def _one_thread_per_worker():
    """test.sh runs two pytest-xdist workers on two cores: one torch thread each, the real pair's
    worker too. Two threads a worker is three or four on two cores, and an OpenMP barrier then
    waits on a thread that is not running (2-core AVX2 EPYC, 2026-11-26): the chi-square tests
    of four files took 3:40 with one thread a worker and were still running after 14 minutes
    with torch's default two; the real pair's cold calibration took 600 s beside the other worker."""
    with _torch_threads(1) if os.environ.get("PYTEST_XDIST_WORKER") else contextlib.nullcontext():
        yield


@pytest.fixture
def one_thread():
    """Tiny matrices: OpenMP threads only add sync cost (badly so on a loaded machine).
    A file opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    with _torch_threads(1):
        yield


# ------------------------------------------------- shared across the session
# Loading pairs, building the page and launching Chromium cost seconds each on a
# 2-core machine (the real pair: a minute and ~8 GB); each is made once, on first use.


@pytest.fixture(scope="session")
def tiny_pair(pair_dirs):
    """The tiny pair loaded as the app loads it (ModelPair, costs calibrated at load).
    Shared: tests must not change it (a test that sets a cache kind loads its own)."""
    from specviz.models import load_pair, resolve_pair
    return load_pair(resolve_pair(None, *pair_dirs), device="cpu")


@pytest.fixture(scope="module")
def real_pair():
    """load(quantize, precision, calibration) -> the embedded default pair (Qwen2.5-Coder 1.5B +
    0.5B), loaded once per setting and kept while the next test asks for the same one: one real
    pair in memory at a time, released when the module ends (its xdist worker goes on)."""
    held: dict = {}

    def load(quantize="auto", precision="auto", calibration="auto"):
        from specviz.models import PAIRS, load_pair
        key = (quantize, precision, calibration)
        if key not in held:
            held.clear()  # ~8 GB: never two at once
            held[key] = load_pair(PAIRS["default"], device="cpu", quantize=quantize, precision=precision,
                                  calibration=calibration)
        return held[key]

    yield load
    held.clear()


@pytest.fixture(scope="session")
def inproc_app(tmp_path_factory):
    """The page built in this process on the tiny pair (tests may monkeypatch the
    engine and see inside), launched once; as app.py builds it, without
    --allow-local-paths. Tests must leave its pair loaded."""
    from browser.server import InProcessApp
    app = InProcessApp(tmp_path_factory.mktemp("tiny-inproc-shared"))
    yield app
    app.close()


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for every browser test (test_browser*.py, test_xss.py)."""
    import os
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=os.environ.get("SPECVIZ_CHROMIUM", "/usr/bin/chromium"),
                              args=CHROMIUM_ARGS)
        yield b
        b.close()
