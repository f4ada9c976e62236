#!/usr/bin/env python3
"""A stand-in for vLLM's HTTP API, for the load balancer's molecule scenario only.

Answers like the real engine where the load balancer cares: GET /health is 200 (503
while /run/fake-engine-loading exists: "the model is still loading"), /v1/* needs the
engine's own key when one is set, /v1/completions names the host that served it and can
stream, a request for another model than the one it serves gets vLLM's 404, and
/tokenize exists (the load balancer must refuse it). While
/run/fake-engine-stopping exists it answers completions with 500 and /health with 200,
as vLLM does during its graceful shutdown.
"""

import argparse
import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOADING_FLAG = "/run/fake-engine-loading"
STOPPING_FLAG = "/run/fake-engine-stopping"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    name = ""
    model = ""
    api_key = ""

    def log_message(self, *args):
        pass

    def _json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self):
        if not self.api_key:
            return True
        if self.headers.get("Authorization") == f"Bearer {self.api_key}":
            return True
        self._json(401, {"error": "engine: invalid API key"})
        return False

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {}

    def do_GET(self):
        if self.path == "/health":
            if os.path.exists(LOADING_FLAG):
                self._json(503, {"status": "loading"})
            else:
                self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            if self._authorized():
                self._json(200, {"object": "list", "data": [{"id": self.model}],
                                 "served_by": self.name})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self):
        body = self._body()
        if self.path == "/tokenize":
            self._json(200, {"tokens": [1, 2, 3], "served_by": self.name})
        elif self.path in ("/v1/completions", "/v1/chat/completions"):
            if not self._authorized():
                return
            if body.get("model", self.model) != self.model:
                self._json(404, {"error": {"message": f"The model `{body.get('model')}` does"
                                           " not exist.", "code": 404}, "served_by": self.name})
            elif os.path.exists(STOPPING_FLAG):
                self._json(500, {"error": {"message": "cannot schedule new futures after shutdown",
                                           "code": 500}})
            elif body.get("stream"):
                self._stream(int(body.get("chunks", 4)), float(body.get("interval", 0.5)))
            else:
                self._json(200, {"object": "text_completion", "served_by": self.name,
                                 "choices": [{"text": f"hello from {self.name}"}]})
        else:
            self._json(404, {"error": "not found"})

    def _stream(self, chunks, interval):
        """Server-sent events, one chunk every `interval` seconds, chunked encoding."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(chunks):
            event = f"data: {json.dumps({'served_by': self.name, 'i': i})}\n\n".encode()
            self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            self.wfile.flush()
            time.sleep(interval)
        done = b"data: [DONE]\n\n"
        self.wfile.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
        self.wfile.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    Handler.name = args.name
    Handler.model = args.model
    Handler.api_key = os.environ.get("FAKE_ENGINE_API_KEY", "")
    ThreadingHTTPServer(("0.0.0.0", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
