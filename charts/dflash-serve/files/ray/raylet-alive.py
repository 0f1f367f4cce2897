"""Exit 0 while this pod's raylet runs (a Ray worker's liveness and readiness probe).

It reads /proc, so it needs neither Ray's dashboard agent (KubeRay's default probes call the
agent on port 52365) nor a reachable head: a worker lending its GPUs is alive while its raylet
is.
"""

import os
import sys


def raylet_running() -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv0 = cmdline.read().split(b"\0", 1)[0]
        except OSError:  # the process exited while we looked
            continue
        if os.path.basename(argv0) == b"raylet":
            return True
    return False


if __name__ == "__main__":
    sys.exit(0 if raylet_running() else 1)
