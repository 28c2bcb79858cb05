"""The two things we read from a vLLM server: a streamed completion (one SSE
chunk per engine step) and the Prometheus counters at /metrics."""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from .vllm_server import Server, VllmError, get_text, served_model

# vLLM V1 counters (vllm/v1/spec_decode/metrics.py); Prometheus adds _total
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class SpecCounters:
    """Speculative-decoding counters of one server, summed over its engines."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: dict[int, float] = field(default_factory=dict)
    present: bool = False  # the server exposes spec-decode metrics at all

    def minus(self, before: "SpecCounters") -> "SpecCounters":
        keys = set(self.per_pos) | set(before.per_pos)
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted - before.accepted,
                            {k: self.per_pos.get(k, 0.0) - before.per_pos.get(k, 0.0) for k in sorted(keys)},
                            self.present)

    @property
    def gamma(self) -> int:
        return len(self.per_pos)


def parse_metrics(text: str) -> SpecCounters:
    c = SpecCounters()
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == DRAFTS:
            c.drafts += value
        elif name == DRAFT_TOKENS:
            c.draft_tokens += value
        elif name == ACCEPTED:
            c.accepted += value
        elif name == PER_POS:
            pos = int(dict(_LABEL.findall(labels)).get("position", 0))
            c.per_pos[pos] = c.per_pos.get(pos, 0.0) + value
        else:
            continue
        c.present = True
    return c


def read_counters(base_url: str) -> SpecCounters | None:
    """None where the server has no /metrics (then acceptance comes from the stream alone)."""
    try:
        return parse_metrics(get_text(base_url.rstrip("/") + "/metrics"))
    except (OSError, ValueError):
        return None


@dataclass
class Chunk:
    """One streamed chunk: the tokens one engine step produced."""

    t: float  # perf_counter when it arrived
    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    # per token, when asked for (top_logprobs > 0): {token id: logprob} of the row's top tokens
    tops: list[dict[int, float]] | None = None


def stream_completion(base_url: str, model: str, prompt_ids: list[int], *, max_tokens: int,
                      temperature: float, top_p: float, top_k: int, seed: int | None, timeout: float = 600,
                      top_logprobs: int = 0):
    """Yield Chunks of a streamed /v1/completions request for `prompt_ids`.

    `return_token_ids` makes vLLM send each chunk's token ids; closing the
    generator closes the connection, which makes vLLM abort the request.
    `top_logprobs` > 0: each token's row's top logprobs too (`logprobs`, keyed by
    id with `return_tokens_as_token_ids`: "token_id:42")."""
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": temperature,
            "top_p": top_p, "stream": True, "return_token_ids": True, "skip_special_tokens": False}
    if top_logprobs:
        body.update(logprobs=top_logprobs, return_tokens_as_token_ids=True)
    if top_k:
        body["top_k"] = top_k
    if seed is not None:
        body["seed"] = seed
    req = urllib.request.Request(base_url.rstrip("/") + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise VllmError(f"vLLM refused the request: {_http_message(e)}") from None
    except OSError as e:
        why = getattr(e, "reason", e)
        raise VllmError(f"the vLLM server at {base_url} does not answer ({why})") from None
    with resp:
        for raw in _lines(resp, base_url):
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            chunk = _chunk(json.loads(data), time.perf_counter())
            if chunk is not None:
                yield chunk
    raise VllmError(f"the vLLM server at {base_url} closed the stream before the run finished "
                    "(no [DONE]): its engine stopped; its log says why")


def _lines(resp, base_url: str):
    """The response's lines; a connection the server drops mid-run (its engine died) is one line."""
    import http.client
    try:
        yield from resp
    except (OSError, http.client.HTTPException) as e:
        raise VllmError(f"the vLLM server at {base_url} stopped answering mid-run "
                        f"({type(e).__name__}: {e}); its log says why") from None


def _chunk(obj: dict, t: float) -> Chunk | None:
    if "error" in obj:
        raise VllmError(f"vLLM failed mid-run: {obj['error'].get('message', obj['error'])}")
    choices = obj.get("choices") or []
    if not choices:
        return None  # a usage-only chunk
    ch = choices[0]
    ids = ch.get("token_ids")
    if ids is None:
        raise VllmError("this vLLM server does not return token ids (needs vLLM ≥ 0.10): upgrade it")
    return Chunk(t, list(ids), ch.get("text") or "", ch.get("finish_reason"), _tops(ch.get("logprobs")))


def _tops(lp) -> list[dict[int, float]] | None:
    """The chunk's top_logprobs, keys "token_id:42" → 42; None where the server sent none."""
    rows = (lp or {}).get("top_logprobs") if isinstance(lp, dict) else None
    if not rows:
        return None
    out = []
    for row in rows:
        d = {}
        for key, v in (row or {}).items():
            head, _, num = str(key).rpartition(":")
            if head == "token_id" and num.lstrip("-").isdigit() and v is not None:
                d[int(num)] = float(v)
        out.append(d)
    return out


def _http_message(e) -> str:
    try:
        body = json.loads(e.read().decode())
        msg = body.get("error", body)
        return msg.get("message", str(msg)) if isinstance(msg, dict) else str(msg)
    except Exception:  # noqa: BLE001 - the status line is still a message
        return f"HTTP {e.code} {e.reason}"


def read_only_servers(urls) -> list[Server]:
    """Servers at `urls`, each classified plain or speculative (γ) by its /metrics."""
    out = []
    for url in urls:
        url = url.rstrip("/")
        model = served_model(url)
        c = read_counters(url)
        gamma = c.gamma if c is not None and c.present else 0
        out.append(Server(url, model, gamma, "speculative" if gamma else ""))
    return out
