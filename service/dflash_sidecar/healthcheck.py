"""The container HEALTHCHECK: GET /livez on the port the sidecar (PID 1) really listens on.

The port is read from PID 1's own command line (`--port N`), then its environment
(`DFLASH_SIDECAR_PORT`), then the default 9100, so `docker run IMAGE sidecar --port 9200` is
checked on 9200. Exit status 0 when /livez answers 200 within two seconds.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

DEFAULT_PORT = 9100


def sidecar_port(proc: Path = Path("/proc/1")) -> int:
    try:
        argv = proc.joinpath("cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        argv = []
    for i, arg in enumerate(argv):
        if arg == "--port" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if arg.startswith("--port=") and arg[7:].isdigit():
            return int(arg[7:])
    try:
        environ = proc.joinpath("environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        environ = []
    for entry in environ:
        name, _, value = entry.partition("=")
        if name == "DFLASH_SIDECAR_PORT" and value.isdigit():
            return int(value)
    return DEFAULT_PORT


def main() -> int:
    url = f"http://127.0.0.1:{sidecar_port()}/livez"
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return 0 if reply.status == 200 else 1
    except OSError as err:
        print(f"{url}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
