"""Bad input never crashes the app or the CLI.

Every case goes through the public API (gradio_client against `python app.py`
on the tiny random pair; raw HTTP for what gradio_client cannot send) or the
CLI, gets one clear message, and a good run right after still works. Runtime
failures (out of memory inside an engine step, a tokenizer refusing input) are
simulated in process, where the engine can be monkeypatched.
"""
import json
import re
import time
import urllib.request

import pytest

pytest.importorskip("gradio_client")

from browser.server import InProcessApp, ready_client, shared_server  # noqa: E402
from helpers import run_fields  # noqa: E402

from specviz.ui.method_options import METHOD_CHOICES, TRAINED_ONLY  # noqa: E402

FIELDS = run_fields()  # every input of /run, in order (a raw queue/join must send them all)
GOOD = dict(prompt="def f(x):", gamma=4, max_new_tokens=8, temperature=0.0, top_p=1.0, top_k=0, seed=0,
            chat_template=False, mode="fair", method="draft", gamma_auto=False,
            tree_shape="", tree_budget=None, window=4, guesses=2, exit_layer=None, trained=True, skip_layers="",
            fresh_memory=False, share_memory=False)
BASE, SPEC, STATS, INFO = 0, 1, 2, 3


def args(**kw):
    a = {**GOOD, **kw}
    return tuple(a[f] for f in FIELDS)


def good_run_works(client):
    out = client.predict(*args(), api_name="/run")
    assert "identical outputs" in out[INFO], out[INFO]


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.fixture(scope="module")
def client(server):
    return ready_client(server)


# (field, value, what the visitor reads); "gradio" marks values gradio itself
# refuses before our handler runs (its message is shown as is)
API_CASES = [
    ("prompt", "", "The prompt is empty: type something or pick a preset."),
    ("prompt", "  \n\t ", "The prompt is empty: type something or pick a preset."),
    ("prompt", None, "The prompt is empty: type something or pick a preset."),
    ("prompt", "x" * 1100, "Prompt (1100 tokens) plus 8 new tokens does not fit the model's context of 1024 "
                           "tokens. Shorten the prompt or lower max new tokens."),
    ("prompt", "x" * 3000, "The prompt is too long: 3000 tokens, the limit here is 2048. Shorten it."),
    ("prompt", "x" * 70000, "The prompt is too long: 70000 characters, the limit here is 2048 tokens."),
    ("gamma", 0, "γ (draft length) must be between 1 and 16, got 0."),
    ("gamma", 17, "γ (draft length) must be between 1 and 16, got 17."),
    ("gamma", 2.5, "γ (draft length) must be a whole number, got 2.5."),
    ("gamma", "abc", "γ (draft length) must be a whole number, got 'abc'."),
    ("gamma", None, "γ (draft length) must be a whole number, got None."),
    ("gamma", [1, 2], "γ (draft length) must be a whole number, got [1, 2]."),
    ("temperature", -0.5, "Temperature must be between 0.0 and 2.0, got -0.5."),
    ("temperature", 2.5, "Temperature must be between 0.0 and 2.0, got 2.5."),
    ("temperature", "hot", "Temperature must be a number, got 'hot'."),
    ("top_p", 0, "Top-p must be between 0.01 and 1.0, got 0."),
    ("top_p", 1.5, "Top-p must be between 0.01 and 1.0, got 1.5."),
    ("top_p", "x", "Top-p must be a number, got 'x'."),
    ("top_k", -1, "Top-k must be between 0 and 1000, got -1."),
    ("top_k", 1001, "Top-k must be between 0 and 1000, got 1001."),
    ("top_k", 3.5, "Top-k must be a whole number, got 3.5."),
    ("max_new_tokens", 0, "Max new tokens must be between 1 and 512, got 0."),
    ("max_new_tokens", 100000, "Max new tokens must be between 1 and 512, got 100000."),
    ("max_new_tokens", "ten", "Max new tokens must be a whole number, got 'ten'."),
    ("seed", -1, "Seed must be between 0 and 2^63 - 1, got -1."),
    ("seed", 1.5, "Seed must be a whole number, got 1.5."),
    ("seed", "abc", "Seed must be a whole number, got 'abc'."),
    ("mode", "warp-speed", "gradio:Value: 'warp-speed' (type: <class 'str'>) is not in the list of choices: "
                           "['fair', 'parallel']"),
    ("method", "magic", "gradio:Value: 'magic' (type: <class 'str'>) is not in the list of choices: "
                        + str([v for _, v in METHOD_CHOICES if v not in TRAINED_ONLY])),  # what can run
]


@pytest.mark.parametrize("field, value, message", API_CASES,
                         ids=[f"{f}={str(v)[:12]!r}" for f, v, _ in API_CASES])
def test_api_bad_input_gets_a_clear_message(client, server, field, value, message):
    job = client.submit(*args(**{field: value}), api_name="/run")
    with pytest.raises(Exception) as info:
        job.result(timeout=60)
    by_gradio = message.startswith("gradio:")
    message = message.removeprefix("gradio:")
    assert str(info.value) == message or message in str(info.value), str(info.value)
    assert "Traceback" not in str(info.value)
    if not by_gradio:
        # the page shows it too, in the run info line above the panes (escaped)
        shown = [o[INFO] for o in job.outputs() if isinstance(o[INFO], str) and "sv-status-error" in o[INFO]]
        assert shown and message in text_of(shown[-1]), shown
    assert server.alive()
    good_run_works(client)


def raw_run(server, data):
    """POST /run through gradio's plain HTTP API with hand-written JSON (NaN,
    Infinity, lone surrogates, a wrong number of inputs: what gradio_client
    refuses to send); returns (event, data) of the last server-sent event."""
    body = json.dumps({"data": data}).encode()  # ensure_ascii: lone surrogates travel as \\ud800
    req = urllib.request.Request(server.url + "gradio_api/call/run", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        event_id = json.load(r)["event_id"]
    with urllib.request.urlopen(server.url + f"gradio_api/call/run/{event_id}", timeout=60) as r:
        text = r.read().decode("utf-8")
    events = re.findall(r"event: (\w+)\ndata: (.*)", text)
    kind, payload = events[-1]
    return kind, json.loads(payload)


RAW_CASES = [
    ({"gamma": float("nan")}, "γ (draft length) must be a whole number, got nan."),
    ({"temperature": float("inf")}, "Temperature must be a finite number, got inf."),
    ({"top_p": float("-inf")}, "Top-p must be a finite number, got -inf."),
    ({"seed": float("nan")}, "Seed must be a whole number, got nan."),
]


@pytest.mark.parametrize("bad, message", RAW_CASES, ids=[next(iter(b)) for b, _ in RAW_CASES])
def test_raw_http_non_finite_numbers(client, server, bad, message):
    kind, payload = raw_run(server, list(args(**bad)))
    assert kind == "error" and payload["error"] == message, (kind, payload)
    good_run_works(client)


def test_raw_http_lone_surrogate_prompt_runs(client, server):
    """A lone surrogate (a half emoji from a careless client) is replaced by U+FFFD, not a crash."""
    kind, payload = raw_run(server, list(args(prompt="ab\ud800cd")))
    assert kind == "complete", payload
    assert "ab\ufffdcd" in payload[BASE] and "\ud800" not in json.dumps(payload, ensure_ascii=False)
    good_run_works(client)


def test_raw_http_wrong_number_of_inputs(client, server):
    kind, payload = raw_run(server, ["def f(x):", 4])
    needed = len(list(args()))  # every input the page sends (the run handler's, in order)
    assert kind == "error" and f"didn't receive enough input values (needed: {needed}, got: 2)" in payload["error"]
    assert server.alive()
    good_run_works(client)


# ---------------------------------------------------------------- model pairs


def wait_loaded(client, timeout=60):
    end = time.monotonic() + timeout
    status = ""
    while time.monotonic() < end:
        status = client.predict(api_name="/status")[0]
        if "sv-status-loading" not in status:
            return status
        time.sleep(0.2)
    raise TimeoutError(status)


def text_of(html):
    return re.sub(r"<[^>]+>", "", html).replace("&#x27;", "'")


def said_once(out, message):
    """A failed run's last outputs: `message` in the run info line and nowhere else, no "failed" in the
    panes or the numbers (issue 71: a toast, the line, both panes and the speedup box each said it)."""
    texts = [text_of(o) if isinstance(o, str) else "" for o in out[:4]]
    assert message in texts[INFO] and sum(t.count(message) for t in texts) == 1, texts
    assert not any("failed" in t for t in (texts[BASE], texts[SPEC], texts[STATS])), texts


PAIR_CASES = [
    # (pair key, target, draft, message), on a server without --allow-local-paths
    ("custom", "/etc", "/tmp", "Local paths are disabled on this server: use a Hugging Face Hub id instead of '/etc'"),
    ("custom", "~/.ssh", "org/x", "Local paths are disabled on this server"),
    ("custom", "../models", "org/x", "Local paths are disabled on this server"),
    ("custom", "not a model!", "org/x", "'not a model!' is neither a Hugging Face Hub id (org/name) nor an existing "
                                        "local folder"),
    ("custom", "org/a", "", "custom pair: both a target and a draft model are needed"),
    ("custom", "", "", "custom pair: give both a target and a draft model"),
    ("custom", "embedded:nope", "org/x", "unknown embedded model 'embedded:nope'"),
    (None, "", "", "Pick a model pair in the list first."),
]


@pytest.mark.parametrize("key, target, draft, message", PAIR_CASES, ids=[c[1] or str(c[0]) for c in PAIR_CASES])
def test_pair_refused_before_loading(client, key, target, draft, message):
    status = client.predict(key, target, draft, api_name="/load_pair")[0]
    assert message in text_of(status), status
    assert "sv-status-ready" in status  # the pair in service is untouched
    good_run_works(client)


def test_unknown_pair_key_is_refused_by_gradio(client):
    with pytest.raises(Exception, match=r"Value: nope is not in the list of choices"):
        client.predict("nope", "", "", api_name="/load_pair")
    good_run_works(client)


def test_hub_id_without_network(client):
    """The test server runs with HF_HUB_OFFLINE=1: a Hub id cannot be fetched."""
    client.predict("custom", "no-such-org/no-such-model", "no-such-org/no-such-draft", api_name="/load_pair")
    status = wait_loaded(client)
    assert ("could not load 'no-such-org/no-such-model': not found locally and the Hugging Face Hub is "
            "unreachable (no network)") in text_of(status), status
    assert "Still using" in status
    good_run_works(client)


def test_markup_in_a_model_id_is_escaped(client):
    status = client.predict("custom", '<img src=x onerror="window.__xss=1">', "org/x", api_name="/load_pair")[0]
    assert "<img" not in status and "&lt;img src=x onerror=&quot;window.__xss=1&quot;&gt;" in status


@pytest.fixture(scope="module")
def inproc(tmp_path_factory):
    """The page in this process (the engine can be monkeypatched), built as
    `app.py --allow-local-paths` builds it."""
    app = InProcessApp(tmp_path_factory.mktemp("tiny-inproc"), allow_local_paths=True)
    yield app
    app.close()


def test_local_paths_with_the_operator_flag(inproc, other_vocab_dir, tmp_path):
    client = inproc.client()
    tiny = f"{inproc.dir}/target"
    cases = [
        (tiny, other_vocab_dir, "draft and target use different vocabularies (11 vs 89 tokens): pick a draft "
                                "from the same model family"),
        (str(tmp_path / "missing"), tiny, f"local path not found: '{tmp_path / 'missing'}'"),
        (str(tmp_path), tiny, "the folder holds no usable model (config.json and weights)"),
    ]
    for target, draft, message in cases:
        client.predict("custom", target, draft, api_name="/load_pair")
        status = wait_loaded(client)
        assert message in text_of(status) and "Still using" in status, status
        good_run_works(client)
    # a good local pair loads and serves
    client.predict("custom", tiny, f"{inproc.dir}/draft", api_name="/load_pair")
    status = wait_loaded(client)
    # named by its last part, the whole path in the tooltip (ui/glossary.short_label)
    assert "sv-status-ready" in status and f"title='{tiny} + " in status, status
    assert f"…/{tiny.rstrip('/').split('/')[-1]} + " in text_of(status), status
    good_run_works(client)


# ---------------------------------------------------------------- in process


@pytest.mark.parametrize("error", ["cuda", "cpu"])
def test_out_of_memory_in_an_engine_step(inproc, monkeypatch, error):
    """An engine step raises out of memory mid-run: memory is freed
    (runner.free_memory), the page says so, and the next run works."""
    import torch

    import specviz.engine.decoding as decoding
    import specviz.ui.handlers as blocks  # the page's handlers look these names up

    real_step, real_free = decoding.forward_logits, blocks.free_memory
    calls, freed = [0], []

    def failing_step(*a, **kw):
        calls[0] += 1
        if calls[0] == 6:
            if error == "cuda":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory: "
                               "you tried to allocate 1234 bytes. out of memory")
        return real_step(*a, **kw)

    monkeypatch.setattr(decoding, "forward_logits", failing_step)
    monkeypatch.setattr(blocks, "free_memory", lambda: (freed.append(1), real_free()))
    client = inproc.client()
    job = client.submit(*args(max_new_tokens=32), api_name="/run")
    with pytest.raises(Exception) as info:
        job.result(timeout=60)
    message = ("The run ran out of memory. Try fewer new tokens, a shorter prompt, a smaller γ or a smaller "
               "model pair. The app is still running.")
    assert str(info.value) == message
    assert freed == [1]
    said_once(job.outputs()[-1], message)  # in the page, above the panes, once
    monkeypatch.setattr(decoding, "forward_logits", real_step)
    good_run_works(client)


def test_unexpected_failure_before_the_run(inproc, monkeypatch):
    """Something other than bad settings fails while preparing (here the
    tokenizer): one line in the page, the app keeps serving."""
    import specviz.ui.handlers as blocks  # the page's handlers look these names up

    def broken(*a, **kw):
        raise ValueError("tokenizer exploded\nwith a second line")

    monkeypatch.setattr(blocks, "encode_prompt", broken)
    client = inproc.client()
    job = client.submit(*args(), api_name="/run")
    with pytest.raises(Exception) as info:
        job.result(timeout=60)
    message = "The run failed: tokenizer exploded. The app is still running; try again or change the settings."
    assert str(info.value) == message  # the API caller gets the error (the page: no toast)
    said_once(job.outputs()[-1], message)
    monkeypatch.undo()
    good_run_works(client)


# ---------------------------------------------------------------- CLI


def cli(capsys, *argv):
    from specviz.cli.main import main
    try:
        code = main(["generate", *argv])
    except SystemExit as e:  # argparse
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


CLI_CASES = [
    (["--prompt", ""], "error: The prompt is empty: type something or pick a preset."),
    (["--prompt", "x" * 1100], "error: Prompt (1100 tokens) plus 64 new tokens does not fit the model's context "
                               "of 1024 tokens."),
    (["--prompt", "x", "--temperature", "warm"], "error: Temperature must be a number, got 'warm'."),
    (["--prompt", "x", "--temperature", "nan"], "error: Temperature must be a finite number, got 'nan'."),
    (["--prompt", "x", "--top-p", "2"], "error: Top-p must be between 0.01 and 1.0, got '2'."),
    (["--prompt", "x", "--top-k", "-5"], "error: Top-k must be between 0 and 1000, got '-5'."),
    (["--prompt", "x", "--top-k", "many"], "error: Top-k must be a whole number, got 'many'."),
    (["--prompt", "x", "--max-new-tokens", "0"], "error: Max new tokens must be between 1 and 512, got '0'."),
    (["--prompt", "x", "--seed", "-1"], "error: Seed must be between 0 and 2^63 - 1, got '-1'."),
    (["--prompt", "x", "--gamma", "1e9"], "error: γ (draft length) must be between 1 and 16, got '1e9'."),
    (["--prompt", "x", "--num-samples", "0"], "error: --num-samples must be at least 1."),
    (["--prompt", "x", "--method", "magic"], "error: argument --method: invalid choice: 'magic'"),
    (["--prompt", "x", "--device", "tpu"], "error: unknown device 'tpu': use cpu, cuda or mps"),
    (["--prompt", "x", "--target", "not a model!", "--draft", "org/x"], "error: 'not a model!' is neither a Hugging Face Hub id"),
    (["--prompt", "x", "--pair", "nope"], "error: unknown pair 'nope': choose one of default, smollm2"),
    (["--prompt", "x", "--target", "specviz-test/nope", "--draft", "specviz-test/nope2"],
     "error: could not load 'specviz-test/nope': not found locally and the Hugging Face Hub is unreachable"),
]


@pytest.mark.parametrize("argv, message", CLI_CASES, ids=[" ".join(a)[:30] for a, _ in CLI_CASES])
def test_cli_bad_input_one_line(capsys, monkeypatch, pair_dirs, argv, message):
    from specviz.models import registry as M  # where the Hub probe lives
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    M._hub_reachable.cache_clear()
    t, d = pair_dirs
    pair = [] if any(a in argv for a in ("--target", "--pair")) else ["--target", t, "--draft", d]
    code, out, err = cli(capsys, *pair, *argv)
    assert code == 2, (code, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith(message), err
    assert "Traceback" not in err
    # and a good run right after
    code, out, err = cli(capsys, "--target", t, "--draft", d, "--prompt", "x", "--max-new-tokens", "4", "--json")
    assert code == 0 and json.loads(out)["token_ids"]
    M._hub_reachable.cache_clear()


def test_cli_out_of_memory_is_one_line(capsys, monkeypatch, pair_dirs):
    import torch

    import specviz.engine.decoding as decoding

    def oom(*a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(decoding, "forward_logits", oom)
    code, _, err = cli(capsys, "--target", pair_dirs[0], "--draft", pair_dirs[1], "--prompt", "x")
    assert code == 1 and err.startswith("error: out of memory") and len(err.strip().splitlines()) == 1
