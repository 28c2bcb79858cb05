#!/usr/bin/env python3
"""A stand-in for llama.cpp's `llama-server` on 127.0.0.1 for the tests (no
build needed): the same command line, a start-up log with llama.cpp's
`system_info` line, /health, /metrics counters and a /completion answer shaped
like the real one (tests/data/llamacpp/, captured from llama-server built from
llama-cpp-python 0.3.36's vendored source).

    tests/fake_llama_server.py -m T.gguf [-md D.gguf --spec-draft-n-max N] --port P ...
"""
from __future__ import annotations

import json
import sys
from http.server import ThreadingHTTPServer

from fake_http import QuietHandler

TOKENS = [10 + (i % 40) for i in range(256)]  # what every completion generates
ACCEPTS = [3, 1, 0, 2, 4, 4, 0, 1]  # drafts accepted per verification step (capped at n_max)
PROMPT_MS, TOKEN_MS = 20.0, 5.0  # the timings it reports
SYSTEM_INFO = ("system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | SSSE3 = 1 | "
               "AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 0 | LLAMAFILE = 1 | "
               "OPENMP = 1 | REPACK = 1 |")


class Fake:
    def __init__(self, n_max: int = 0):
        self.n_max, self.steps, self.drafted, self.accepted = n_max, 0, 0, 0

    def completion(self, body: dict) -> dict:
        n, prompt = int(body["n_predict"]), body["prompt"]
        drafted = accepted = steps = 0
        if self.n_max:  # after the prefill token, steps of (accepted + 1) tokens
            i, k = 1, 0
            while i < n:
                acc = min(ACCEPTS[k % len(ACCEPTS)], self.n_max, n - i - 1)
                steps, drafted, accepted, i, k = steps + 1, drafted + self.n_max, accepted + acc, i + acc + 1, k + 1
        self.steps, self.drafted, self.accepted = self.steps + steps, self.drafted + drafted, self.accepted + accepted
        timings = {"cache_n": 0, "prompt_n": len(prompt), "prompt_ms": PROMPT_MS,
                   "prompt_per_token_ms": PROMPT_MS / len(prompt),
                   "prompt_per_second": 1e3 * len(prompt) / PROMPT_MS,
                   "predicted_n": n, "predicted_ms": TOKEN_MS * (n - 1),
                   "predicted_per_token_ms": TOKEN_MS, "predicted_per_second": 1e3 / TOKEN_MS}
        if drafted:
            timings |= {"draft_n": drafted, "draft_n_accepted": accepted}
        return {"index": 0, "content": "".join(f"<{t}>" for t in TOKENS[:n]), "tokens": TOKENS[:n],
                "id_slot": 0, "stop": True, "model": "fake.gguf", "tokens_predicted": n,
                "tokens_evaluated": len(prompt), "has_new_line": False, "truncated": False,
                "stop_type": "limit", "stopping_word": "", "tokens_cached": len(prompt) + n - 1,
                "timings": timings}

    def metrics(self) -> str:
        return "".join(f"# TYPE llamacpp:{k} counter\nllamacpp:{k} {v}\n" for k, v in (
            ("spec_decode_num_draft_tokens_total", self.drafted),
            ("spec_decode_num_accepted_tokens_total", self.accepted),
            ("spec_decode_num_drafts_total", self.steps)))


def handler(fake: Fake):
    class H(QuietHandler):
        def do_GET(self):
            if self.path == "/health":
                self._send(200, json.dumps({"status": "ok"}))
            elif self.path == "/metrics":
                self._send(200, fake.metrics(), "text/plain")
            else:
                self._send(404, "{}")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/completion" or not body.get("return_tokens"):
                self._send(400, json.dumps({"error": {"message": "bad request"}}))
                return
            self._send(200, json.dumps(fake.completion(body)))
    return H


if __name__ == "__main__":
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    n_max = int(args[args.index("--spec-draft-n-max") + 1]) if "-md" in args else 0
    if "--fail" in " ".join(args) or any(a.endswith("broken.gguf") for a in args):
        print("llama_model_load: error loading model: tensor data is not within the file bounds", flush=True)
        sys.exit(1)
    srv = ThreadingHTTPServer(("127.0.0.1", port), handler(Fake(n_max)))
    print(SYSTEM_INFO, flush=True)
    print(f"main: server is listening on http://127.0.0.1:{port}", flush=True)
    srv.serve_forever()
