"""What the engine tests share: run a generator to its summary, check a round
stream, and the whole-sequence law check every sampling method goes through
(enumerate the target's exact law of short sequences, sample many seeded runs,
chi-square the counts)."""
import itertools
from types import SimpleNamespace

import torch

from specviz.engine.events import Outcome, RoundEvent, RunSummary
from specviz.engine.pair import OURS
from specviz.engine.sampling import warp
from specviz.models.tiny import tiny_model

LAW_PROMPT = [1, 2, 3, 1, 2]


def fake_pair(target=None, draft=None, **kw):
    """A stand-in for a loaded pair with every field of the Pair protocol (engine/pair.py): the
    fields a test names, the rest as a pair that nothing was timed for."""
    spec = SimpleNamespace(name="tiny-test", label="tiny test pair", target="tiny", draft="tiny-draft")
    fields = dict(target=target, draft=draft, tokenizer=None, spec=spec,
                  device=getattr(target, "device", torch.device("cpu")), dtype=torch.float32, eos_ids=[],
                  precision_label="", precision_note="", quantize=None, costs=None, calibration="", note="",
                  unmeasured=(), baseline_pair=None, draft_step=None, engine=OURS, has_chat_template=False,
                  max_positions=None, close=lambda: None)
    return SimpleNamespace(**{**fields, **kw})  # repeats give the lookup stages something to copy


def run(gen):
    events = list(gen)
    assert isinstance(events[-1], RunSummary)
    return events[:-1], events[-1]


def check_stream(rounds, summary):
    """Accepted + appended tokens of the rounds are exactly the output."""
    assert all(isinstance(r, RoundEvent) for r in rounds)
    out = [t.token_id for r in rounds for t in r.tokens if t.in_output]
    assert out == summary.token_ids
    assert summary.n_tokens == len(out) == rounds[-1].total_tokens
    assert summary.accepted == sum(r.n_accepted for r in rounds)
    for r in rounds:
        kinds = [t.outcome for t in r.tokens]
        assert kinds[: r.n_accepted] == [Outcome.ACCEPTED] * r.n_accepted
        if r.appended_id >= 0:
            assert kinds[-1] == (Outcome.RESAMPLED if r.resampled else Outcome.BONUS)
            assert (Outcome.REJECTED in kinds) == r.resampled
        assert r.t_draft >= 0 and r.t_verify > 0 and r.t_end >= r.t_start
    times = [r.t_end for r in rounds]
    assert times == sorted(times)


class NullTok:
    def decode(self, ids, skip_special_tokens=False):
        return ""


def noisy_copy(model, seed, scale=1.0):
    """Same architecture, perturbed weights: agrees often, not always."""
    d = tiny_model(model.config.vocab_size, seed=0, layers=model.config.num_hidden_layers,
                   init=model.config.initializer_range)
    d.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in d.parameters():
            w.add_(torch.randn(w.shape, generator=g) * w.std().clamp_min(0.05) * scale)
    return d


def exact_sequence_probs(model, prompt, length, params):
    """P(sequence) under the warped target, by enumerating all sequences."""
    V = model.config.vocab_size
    probs = {}
    for seq in itertools.product(range(V), repeat=length):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + list(seq)])).logits[0]
        p = warp(logits[len(prompt) - 1: len(prompt) - 1 + length], params)
        probs[seq] = float(torch.prod(p[torch.arange(length), torch.tensor(seq)]))
    return probs


def sample_sequences(decode, target, new_proposer, gamma, params, n, *, prompt=LAW_PROMPT, length=3):
    """n seeded runs of `length` new tokens: the target's exact law, the counts
    of each sequence, and every run's (rounds, summary)."""
    exact = exact_sequence_probs(target, prompt, length, params)
    counts = dict.fromkeys(exact, 0)
    runs = []
    for i in range(n):
        rounds, s = run(decode(target, new_proposer(), NullTok(), prompt, length, gamma, params, seed=i))
        counts[tuple(s.token_ids)] += 1
        runs.append((rounds, s))
    return exact, counts, runs


def acceptance(runs):
    """Accepted / drafted over all runs."""
    return sum(s.accepted for _, s in runs) / sum(s.drafted for _, s in runs)


def chi_square_pvalue(counts, exact, n):
    """Observed counts against n times the exact law; sequences the law never
    produces must never occur, rare ones are pooled so every bin expects >= 5."""
    from scipy.stats import chisquare
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for seq, pr in exact.items():
        if pr == 0:
            assert counts[seq] == 0
        elif pr * n >= 5:
            obs.append(counts[seq])
            exp.append(pr * n)
        else:
            rest_o, rest_e = rest_o + counts[seq], rest_e + pr * n
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    else:
        assert rest_o == 0
    exp = [e * sum(obs) / sum(exp) for e in exp]
    return chisquare(obs, exp).pvalue


def assert_follows_target(counts, exact, n):
    assert chi_square_pvalue(counts, exact, n) > 1e-3


def run_fields() -> tuple:
    """Every input of the page's /run, in order (a raw queue/join must send them all)."""
    from specviz.ui import method_options
    return ("prompt", "gamma", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "chat_template", "mode",
            "method", "gamma_auto", *method_options.KEYS,  # the method settings: generated, in this order
            "fresh_memory",  # the boxes under Run (suffix, hybrid): read no earlier run's output,
            "share_memory")  # and read other visitors' runs of the presets too (off)


def press_stop(client, job, within: float = 10.0):
    """Press the page's Stop while `job` runs: it must end within `within` seconds -> its last output."""
    import time
    assert not job.done(), "the run finished before Stop could be tested"
    t0 = time.monotonic()
    client.predict(api_name="/stop")
    while not job.done() and time.monotonic() - t0 < 3 * within:
        time.sleep(0.05)
    assert job.done() and time.monotonic() - t0 < within, "Stop did not end the run in time"
    return job.outputs()[-1]


def follows_target(t, make_prop, prompt, length, gamma, params, n):
    """Speculative sequences from `make_prop()` against the warped target's exact law: the chi-square
    p-value over sequences expected 5+ times (the rest pooled), after checking the run both
    accepted and rejected drafts."""
    from scipy.stats import chisquare

    from specviz.engine.decoding import speculative
    exact = exact_sequence_probs(t, prompt, length, params)
    counts = dict.fromkeys(exact, 0)
    drafted = accepted = 0
    for i in range(n):
        _, s = run(speculative(t, make_prop(), NullTok(), prompt, length, gamma, params, seed=i))
        counts[tuple(s.token_ids)] += 1
        drafted, accepted = drafted + s.drafted, accepted + s.accepted
    assert 0.05 < accepted / drafted < 0.95, "test needs both accepts and rejections"
    obs = [counts[s] for s in exact if exact[s] * n >= 5]
    exp = [exact[s] * n for s in exact if exact[s] * n >= 5]
    obs.append(n - sum(obs))
    exp.append(n - sum(exp))
    return chisquare(obs, exp).pvalue


def copy_into(out, new) -> None:
    """A fake graph's replay: the fresh outputs `new` copied into the captured ones `out` in place (a
    tensor, or tuples of them, as StaticModel's logits and states and StaticHead's state and logits)."""
    if isinstance(out, torch.Tensor):
        out.copy_(new)
        return
    for o, n in zip(out, new, strict=True):
        copy_into(o, n)


def counting_capture(rows, replayed: list):
    """capture_graph on a CPU: a 'graph' that reruns its forward into the captured outputs when replayed,
    appending rows(outputs) (the graph's row count) to `replayed` at each replay."""
    class Graph:
        def __init__(self, fn, out):
            self.fn, self.out = fn, out

        def replay(self):
            replayed.append(rows(self.out))
            copy_into(self.out, self.fn())

    def capture(fn, device, warmup=2, stream=None, pool=None):
        out = fn()
        return Graph(fn, out), out
    return capture


def interrupted_at(monkeypatch, module, name: str, call: int):
    """module.name (a pass's states reader) raises KeyboardInterrupt on its `call`-th call, as a person
    pressing Ctrl-C mid-pass; the returned function puts the real one back."""
    calls = {"n": 0}
    real = getattr(module, name)

    def flaky(*args, **kw):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(module, name, flaky)
    return lambda: monkeypatch.setattr(module, name, real)
