"""A stand-in model endpoint for warming a harness's own caches at install time.

A Node harness compiles its JavaScript on every start unless Node's compile cache holds the result.
A rollout's sandbox gives each run a fresh TMPDIR, where such a harness keeps that cache by default,
so every rollout would compile everything again. Installing a harness can instead run it once,
outside any sandbox, with the cache pointed at a folder next to the install; rollouts then read
that folder (read-only in the sandbox). That one run needs a model to talk to, and none is served
at install time: `answering_endpoint` stands in for it, answering every Chat Completions request
(streamed or not) with one short final message and no tool call, so the harness loads the modules
of a whole turn and exits.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLY = "ok"


def _completion(model: str) -> dict:
    return {"id": "warmup", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def _chunks(model: str) -> list[dict]:
    head = {"id": "warmup", "object": "chat.completion.chunk", "created": 0, "model": model}
    return [head | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": REPLY}, "finish_reason": None}]},
            head | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}]


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # quiet: an install prints its own lines
        pass

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # a model list, for a harness that asks
        self._send(200, "application/json", b'{"object": "list", "data": []}')

    def do_POST(self) -> None:
        try:
            request = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        except json.JSONDecodeError:
            request = {}
        if (received := getattr(self.server, "received", None)) is not None:
            received.append(request)
        model = str(request.get("model", "warmup"))
        if request.get("stream"):
            body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in _chunks(model)) + b"data: [DONE]\n\n"
            self._send(200, "text/event-stream", body)
        else:
            self._send(200, "application/json", json.dumps(_completion(model)).encode())


@contextlib.contextmanager
def answering_endpoint(received: list[dict] | None = None) -> Iterator[str]:
    """A Chat Completions endpoint on a free local port, for as long as the block runs; yields its
    base URL (without `/v1`). Each request body it is sent is appended to `received`, if given:
    what a harness's configuration puts in its requests, seen without a model."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.received = received  # type: ignore[attr-defined]  (read by the handler)
    thread = threading.Thread(target=server.serve_forever, name="warmup-endpoint", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
