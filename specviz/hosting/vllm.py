"""vLLM as the engine: the same events as ours, from a vLLM server's stream.

What vLLM tells us, and how it maps onto our events:
- Each streamed chunk holds the tokens one engine step produced. On a
  speculative server a step verifies γ drafts, so a chunk of n tokens = n - 1
  accepted drafts + 1 token from the target (bonus when n - 1 = γ, else the
  correction). The very first chunk is the prefill step: one target token.
- Acceptance, overall and per draft position, comes from the server's
  Prometheus counters (/metrics), read before and after the run.
- vLLM does not expose the rejected draft ids, p(x), q(x), the accept
  uniforms, nor the draft's own time: those stay None here (UNMEASURED), and
  the page and the CLI say so instead of showing blanks.
- Greedy runs ask for each token's top-2 logprobs (both sides alike), so the
  greedy check (run/equality.py) can tell a near-tie from a bug: a logprob gap is
  the logit gap (softmax shifts every logit alike). The logits' own magnitude is
  not sent, so the near-tie threshold is taken at magnitude 1: the strictest it
  can be (issue 51: "mismatch", "no record of which tokens the rows ranked top").
"""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import torch

from ..engine.events import Outcome, RoundEvent, RunSummary, TokenEvent
from ..engine.rounds import VirtualClock
from ..engine.sampling import Gap
from ..engine.text import TextStream
from ..errors import RequestError
from ..models import PairSpec
from .logs import log_reason
from .vllm_server import Server, VllmError, start_server, vllm_python
from .vllm_stream import read_counters, read_only_servers, stream_completion

ENGINE = "vllm"
# our method -> vLLM's speculative_config method
METHOD_MAP = {"draft": "draft_model", "lookup": "ngram"}
NOT_EXPOSED = ("vLLM does not expose rejected draft tokens, p(x)/q(x), the accept test or the draft's own "
               "time: tokens are coloured by engine step (a step's tokens = accepted drafts + 1) and "
               "acceptance comes from vLLM's /metrics counters")
UNMEASURED = ("alpha_hat", "c", "t_draft_step", "predicted", "best_gamma", "verify_cost")
FINISH = {"stop": "eos", "length": "max_new_tokens", "abort": "stopped"}
TOP_LOGPROBS = 2  # the near-tie rule needs each row's top two


class VllmPair:
    """Duck-types ModelPair for runner/race/CLI: run_events() streams from vLLM."""

    engine = ENGINE
    unmeasured = UNMEASURED
    costs = None  # no calibration: vLLM's own kernels, timed only end to end
    precision_note = ""
    calibration = ""
    note = ""
    baseline_pair = None  # the servers run both sides
    draft_step = None

    def __init__(self, spec: PairSpec, tokenizer, *, refs: dict | None = None, servers=(), device="cpu",
                 max_model_len: int = 4096, one_at_a_time: bool = True, progress=None):
        self.spec, self.tokenizer = spec, tokenizer
        self.device = torch.device("cpu")  # our clocks read wall time; the GPU work happens inside vLLM
        self.vllm_device = device
        self.target = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=max_model_len),
                                      device=self.device)
        self.max_positions = max_model_len
        self.draft = None
        self.dtype = torch.bfloat16
        self.precision_label = "vLLM (bf16)" if device == "cpu" else "vLLM"
        self.quantize = None
        self.eos_ids = [i for i in [getattr(tokenizer, "eos_token_id", None)] if i is not None]
        self.refs = refs  # local folders / hub ids for servers we start; None: connect only
        self.external = list(servers)  # servers we were pointed at (--vllm-url)
        self.started: dict[tuple, Server] = {}
        self.one_at_a_time = one_at_a_time  # CPU: one server in memory at a time
        self.progress = progress
        self._lock = threading.Lock()

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def server(self, side: str, req) -> Server:
        """The server for one side: an external one, else one we start (and keep)."""
        want = (False, 0, "") if side == "baseline" else (True, req.gamma, METHOD_MAP.get(req.method, ""))
        for s in self.external:
            if bool(s.gamma) == want[0]:
                return s
        if self.refs is None:
            kind = "plain (no speculative_config)" if side == "baseline" else "speculative"
            raise VllmError(f"no {kind} vLLM server among the --vllm-url given: add one for the {side} side")
        with self._lock:
            if want not in self.started:
                if self.one_at_a_time:
                    self.close()
                self.started[want] = self._start(*want)
            return self.started[want]

    def _start(self, speculative: bool, gamma: int, method: str) -> Server:
        spec_config = None
        if speculative:
            spec_config = {"method": method, "num_speculative_tokens": gamma}
            if method == "draft_model":
                spec_config["model"] = self.refs["draft"]
            else:
                spec_config.update(prompt_lookup_max=4, prompt_lookup_min=2)
        return start_server(self.refs["target"], name=self.spec.target, spec_config=spec_config,
                            device=self.vllm_device, progress=self.progress)

    def close(self) -> None:
        for s in self.started.values():
            s.stop()
        self.started.clear()

    def run_events(self, req, side: str, prompt_ids: list[int], stop=None, clock=None):
        if side == "speculative" and req.method not in METHOD_MAP:
            raise RequestError(f"The vLLM engine runs the methods {', '.join(METHOD_MAP)}; "
                               f"{req.method!r} is ours only.")
        events = _events(self, req, side, prompt_ids, stop, clock)
        # the fair race times each side on a clock that runs only while it is
        # stepped; a server keeps generating between our reads, so there the
        # whole request runs inside one step (timed alone) and its events follow
        return _buffered(events) if isinstance(clock, VirtualClock) else events


def _buffered(events):
    yield from list(events)


def _events(pair: VllmPair, req, side: str, prompt_ids, stop, clock):
    server = pair.server(side, req)
    now = clock.now if clock is not None else time.perf_counter
    before = read_counters(server.url) if side == "speculative" else None
    t0 = now()
    chunks = stream_completion(server.url, server.model, list(prompt_ids), max_tokens=req.max_new_tokens,
                               temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=req.seed,
                               top_logprobs=TOP_LOGPROBS if req.temperature == 0 else 0)
    build = _Run(pair.tokenizer, side, server.gamma, len(prompt_ids))
    try:
        for chunk in chunks:
            yield from build.step(chunk, now() - t0)
            if stop is not None and stop.is_set():
                build.reason = "stopped"
                break
    except VllmError as e:
        why = f" ({log_reason(server.log)}; log: {server.log})" if server.log else ""
        raise VllmError(f"{e}{why}") from None
    finally:
        chunks.close()  # closes the connection: vLLM aborts the request
    after = read_counters(server.url) if side == "speculative" else None
    summary = build.summary(now() - t0, server, before, after)
    if side == "speculative" and server.gamma != req.gamma:  # a deployment's γ is its own
        summary.extra["gamma_note"] = f"γ {req.gamma} was asked for; the vLLM server drafts {server.gamma}"
    yield summary


class _Run:
    """Turns chunks into our events and keeps the totals."""

    def __init__(self, tokenizer, side: str, gamma: int, prompt_tokens: int):
        self.text, self.side = TextStream(tokenizer), side
        self.gamma, self.prompt_tokens = gamma, prompt_tokens
        self.out: list[int] = []
        self.steps = self.rounds = self.drafted = self.accepted = self.merged = 0
        self.prefill, self.last_t, self.reason = 0.0, 0.0, "max_new_tokens"

    def step(self, chunk, t: float):
        if not chunk.token_ids:
            return
        if not self.out:
            self.prefill = t
        self.steps += 1
        if chunk.finish_reason:
            self.reason = FINISH.get(chunk.finish_reason, chunk.finish_reason)
        gaps = [_gap(d, x) for d, x in zip(chunk.tops, chunk.token_ids, strict=False)] if chunk.tops else []
        gaps += [None] * (len(chunk.token_ids) - len(gaps))
        if self.side == "baseline":
            for x, g in zip(chunk.token_ids, gaps, strict=False):
                self.out.append(x)
                yield TokenEvent(x, self.text.push(x), Outcome.TARGET, t, gap=g)
        else:
            yield from self._rounds(chunk.token_ids, t, gaps)
        self.last_t = t

    def _rounds(self, ids: list[int], t: float, gaps: list):
        if self.rounds == 0:  # the prefill step: one target token, nothing drafted yet
            yield self._round(ids[:1], t, gaps[:1], gamma=0, prompt=True)
            ids, gaps = ids[1:], gaps[1:]
        size = self.gamma + 1
        if len(ids) > size:
            self.merged += 1  # vLLM merged steps the client had not read yet: split evenly
        for i in range(0, len(ids), size):
            yield self._round(ids[i:i + size], t, gaps[i:i + size], gamma=self.gamma)

    def _round(self, ids: list[int], t: float, gaps: list, *, gamma: int, prompt: bool = False) -> RoundEvent:
        n_acc = len(ids) - 1 if gamma else 0
        toks = []
        for pos, x in enumerate(ids, start=1):
            if not gamma:
                kind, where = Outcome.TARGET, 0
            elif pos <= n_acc:
                kind, where = Outcome.ACCEPTED, pos
            else:
                kind, where = (Outcome.BONUS if n_acc == gamma else Outcome.RESAMPLED), 0
            self.out.append(x)
            toks.append(TokenEvent(x, self.text.push(x), kind, t, round=self.rounds, position=where,
                                   gap=gaps[pos - 1] if pos - 1 < len(gaps) else None))
        self.drafted += gamma
        self.accepted += n_acc
        ev = RoundEvent(index=self.rounds, gamma=gamma, draft_ids=ids[:n_acc], q=[], p=[], u=[], overlap=[],
                        n_accepted=n_acc, appended_id=ids[-1], resampled=bool(gamma) and n_acc < gamma,
                        t_start=self.last_t, t_draft=0.0, t_verify=t - self.last_t, t_end=t,
                        draft_forwards=0, tokens=toks, total_tokens=len(self.out), total_drafted=self.drafted,
                        total_accepted=self.accepted, target_forwards=self.steps,
                        prompt_tokens=self.prompt_tokens if prompt else 0)
        self.rounds += 1
        return ev

    def summary(self, elapsed: float, server: Server, before, after) -> RunSummary:
        extra = {"engine": ENGINE, "server": server.url, "vllm_method": server.method or "plain",
                 "not_exposed": NOT_EXPOSED}
        drafted, accepted = self.drafted, self.accepted
        if self.side == "speculative":
            extra["acceptance_source"] = "vLLM stream (tokens per engine step)"
            if before is not None and after is not None and after.present:
                d = after.minus(before)
                if d.drafts > 0:
                    drafted, accepted = int(d.draft_tokens), int(d.accepted)
                    extra["acceptance_source"] = "vLLM /metrics counters"
                    extra["accepted_per_position"] = [round(v / d.drafts, 4) for v in d.per_pos.values()]
            if self.merged:
                extra["merged_steps"] = self.merged
        return RunSummary(
            side=self.side, method=f"vllm {server.method}" if self.side == "speculative" else "vllm plain",
            token_ids=self.out, text=self.text.final(), n_tokens=len(self.out), elapsed=elapsed,
            prefill=self.prefill, target_forwards=self.steps, stop_reason=self.reason,
            rounds=self.rounds if self.side == "speculative" else 0, drafted=drafted, accepted=accepted,
            verify_time=max(0.0, elapsed - self.prefill) if self.side == "speculative" else 0.0,
            gamma=self.gamma, device=f"vllm@{server.url}",
            prompt_rounds=1 if self.side == "speculative" and self.rounds else 0,
            engine=ENGINE, unmeasured=list(UNMEASURED) if self.side == "speculative" else [], extra=extra)


def _gap(top: dict[int, float], chosen: int) -> Gap | None:
    """A row's top-1 minus top-2 logprob (= the logit gap) with both tokens, the chosen one first
    in an exact tie; top_logit is the top logprob (≤ 0), so the near-tie threshold is taken at
    magnitude 1. None without two entries."""
    if len(top) < 2:
        return None
    (a, la), (b, lb) = sorted(top.items(), key=lambda kv: (-kv[1], kv[0] != chosen, kv[0]))[:2]
    return Gap(la - lb, a, b, la)


# ------------------------------------------------------------------ loading


def load_vllm(spec: PairSpec, *, urls=(), device: str = "cpu", progress=None) -> VllmPair:
    """A VllmPair: connected to `urls` (classified plain / speculative by their
    /metrics), else ready to start servers from the vLLM venv on first use."""
    from transformers import AutoTokenizer

    from ..models import local_refs
    servers = read_only_servers(urls) if urls else []
    if not servers:
        vllm_python()  # "not set up" now, not minutes later
    refs = local_refs(spec, progress)
    try:
        tok = AutoTokenizer.from_pretrained(refs["target"], trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - one line for the visitor
        raise VllmError(f"could not load the tokenizer of {spec.target}: {str(e).splitlines()[0]}") from e
    pair = VllmPair(spec, tok, refs=None if servers else refs, servers=servers, device=device,
                    progress=progress)
    gammas = sorted({s.gamma for s in servers if s.gamma})
    fixed = f"; γ is fixed by the deployment at {', '.join(map(str, gammas))}" if gammas else ""
    where = "the vLLM servers at " + ", ".join(s.url for s in servers) if servers else \
        "vLLM servers started from the vLLM venv (one per side, restarted when γ or the method changes)"
    pair.note = f"Engine: {where}{fixed}. {NOT_EXPOSED}."
    return pair


def vllm_loader(urls=()):
    """A ModelManager loader (the page): load_pair's signature, vLLM underneath."""
    def load(spec, device=None, progress=None, **_ignored):
        return load_vllm(spec, urls=urls, device=device or "cpu", progress=progress)
    return load
