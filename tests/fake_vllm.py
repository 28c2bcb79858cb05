"""A stand-in vLLM OpenAI-compatible server on 127.0.0.1 for the tests: streams
/v1/completions the way vLLM does (one SSE chunk per engine step, token ids in
each chunk) and keeps vLLM's spec-decode Prometheus counters at /metrics.

    python tests/fake_vllm.py ... --port N [--speculative-config JSON]   (CLI like vLLM's api_server)
"""
from __future__ import annotations

import json
import sys
import threading
from http.server import ThreadingHTTPServer

from fake_http import QuietHandler

# the tokens every completion produces and, for a speculative server, the
# number of drafts accepted at each step after the prefill step
TOKENS = [10 + (i % 40) for i in range(64)]
ACCEPTS = [3, 1, 0, 2, 3, 3, 0, 1]


RUNNER_UP = 99  # every row's second token in the logprobs the fake sends


class Fake:
    def __init__(self, gamma: int = 0, model: str = "fake-model", fail_with: str | None = None,
                 die_after: int | None = None, rows: dict | None = None):
        self.gamma, self.model, self.fail_with = gamma, model, fail_with
        self.die_after = die_after  # chunks sent before the stream ends with no [DONE] (a dead engine)
        # asked for logprobs: each token's row {id: logprob}; `rows` overrides positions
        # (a near-tie: {7: {12: -0.69, 99: -0.70}}); the token there is its row's top
        self.rows = rows or {}
        self.tokens = list(TOKENS)
        for i, row in self.rows.items():
            self.tokens[i] = max(row, key=row.get)
        self.drafts = self.draft_tokens = self.accepted = 0
        self.per_pos = [0] * gamma
        self.requests: list[dict] = []

    def chunks(self, n: int) -> list[list[int]]:
        if not self.gamma:
            return [[t] for t in self.tokens[:n]]
        out, i, k = [self.tokens[:1]], 1, 0
        while i < n:
            acc = ACCEPTS[k % len(ACCEPTS)]
            k += 1
            take = min(acc + 1, n - i)
            out.append(self.tokens[i:i + take])
            self.drafts += 1
            self.draft_tokens += self.gamma
            self.accepted += min(acc, take)
            for p in range(min(acc, take)):
                self.per_pos[p] += 1
            i += take
        return out

    def metrics(self) -> str:
        lines = ["# HELP vllm:num_requests_running x", 'vllm:num_requests_running{model_name="m"} 0.0']
        if self.gamma:
            lab = 'engine="0",model_name="m"'
            lines += [f"vllm:spec_decode_num_drafts_total{{{lab}}} {float(self.drafts)}",
                      f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {float(self.draft_tokens)}",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {float(self.accepted)}"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{p}"}} {float(v)}'
                      for p, v in enumerate(self.per_pos)]
        return "\n".join(lines) + "\n"


def handler(fake: Fake):
    class H(QuietHandler):
        def do_GET(self):
            if self.path == "/health":
                self._send(200, "")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": fake.model, "root": fake.model}]}))
            elif self.path == "/metrics":
                self._send(200, fake.metrics(), "text/plain")
            else:
                self._send(404, "{}")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fake.requests.append(body)
            if fake.fail_with:
                self._send(400, json.dumps({"error": {"message": fake.fail_with}}))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunks = fake.chunks(body["max_tokens"])
            at = 0
            for j, ids in enumerate(chunks):
                if j == fake.die_after:
                    return
                last = j == len(chunks) - 1
                obj = {"choices": [{"index": 0, "text": "", "token_ids": ids,
                                    "finish_reason": "length" if last else None}]}
                if body.get("logprobs"):  # as vLLM: top rows keyed "token_id:N" (return_tokens_as_token_ids)
                    rows = [fake.rows.get(at + k, {t: -0.01, RUNNER_UP: -5.0}) for k, t in enumerate(ids)]
                    obj["choices"][0]["logprobs"] = {
                        "tokens": [f"token_id:{t}" for t in ids],
                        "token_logprobs": [r.get(t) for r, t in zip(rows, ids, strict=True)],
                        "top_logprobs": [{f"token_id:{x}": v for x, v in r.items()} for r in rows]}
                at += len(ids)
                self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
    return H


def serve(fake: Fake, port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    srv = ThreadingHTTPServer(("127.0.0.1", port), handler(fake))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


if __name__ == "__main__":  # stands in for `python -m vllm.entrypoints.openai.api_server ...`
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    spec = json.loads(args[args.index("--speculative-config") + 1]) if "--speculative-config" in args else {}
    name = args[args.index("--served-model-name") + 1]
    srv, _ = serve(Fake(spec.get("num_speculative_tokens", 0), name), port)
    print("fake vLLM serving", flush=True)
    threading.Event().wait()
