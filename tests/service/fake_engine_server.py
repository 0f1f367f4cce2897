"""A scripted vLLM engine on a real socket, for the real sidecar process to probe.

It serves `/health`, `/metrics` (vLLM's format, `fake_engine.vllm_page`), `/v1/models` and
`/v1/completions`; a background ticker advances its counters like an engine under the scripted
load (`traffic`, `weak`, `collapsed` or `idle`). `stop()` closes the socket: connection refused,
as for an engine process that died or has not started listening.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.service.fake_engine import Counters, vllm_page

# Accepted drafts per position for 10 drafts of 4 tokens, per load.
LOADS = {
    "traffic": [8, 6, 4, 2],  # mean acceptance length 3.0
    "collapsed": [1, 0, 0, 0],  # mean acceptance length 1.1: wrong features
    # Mean acceptance length 1.5: degraded. Position 0 at 0.5 stays clear of the default
    # degraded_position0 (0.4): a ratio sitting on a threshold falls on either side of it with
    # float noise in the rates, and flipped DFlashPosition0Drop in one CI run.
    "weak": [5, 0, 0, 0],
    "idle": None,
}


class FakeEngineServer:
    def __init__(self, port: int = 0, tick_s: float = 0.05) -> None:
        self.counters = Counters()
        self.load = "idle"
        self.health_status = 200
        self.completion_status = 200
        self.extra_page = b""  # appended to every /metrics page (big or hostile pages)
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, kind: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send(server.health_status, b"")
                elif self.path == "/metrics":
                    with server.lock:
                        page = vllm_page(server.counters)
                    self._send(200, page.encode() + server.extra_page)
                elif self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": "tiny"}]}).encode())
                else:
                    self._send(404, b"")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if server.completion_status != 200:
                    self._send(server.completion_status, b"EngineCore died")
                    return
                with server.lock:
                    server.counters.generation += 1
                self._send(200, json.dumps({"choices": [{"text": "!"}]}).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self.httpd.serve_forever, daemon=True),
            threading.Thread(target=self._tick, args=(tick_s,), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _tick(self, tick_s: float) -> None:
        while not self._stop.wait(tick_s):
            accepted = LOADS[self.load]
            with self.lock:
                if accepted is None:
                    self.counters.running = 0
                else:
                    self.counters.running = 2
                    self.counters.step(10, accepted, extra_tokens=5)

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def wait_until(check, timeout: float = 10.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout:g}s")
        time.sleep(0.05)
