"""A stand-in for one part of the local stack (engine, sidecar, router, Prometheus): an HTTP
server on --port that answers every GET with 200 and a model list naming --model, after a
start-up delay (--delay: the window a fault can land in). With --helper it starts a child that
blanks its environment, as vLLM's EngineCore does (setproctitle): the stack's marker is gone
from it. `--tag` only marks the command line, for the fault test to find every stand-in."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--helper", action="store_true")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    if args.helper:
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", "fake-part-helper", args.tag],
            env={},
        )
    time.sleep(args.delay)
    body = json.dumps({"data": [{"id": args.model}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
