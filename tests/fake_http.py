"""What the fake servers (fake_vllm.py, fake_llama_server.py) share: a quiet handler
that answers with a body, its type and length."""
from http.server import BaseHTTPRequestHandler


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, body, ctype="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
