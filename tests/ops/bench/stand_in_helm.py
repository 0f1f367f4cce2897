"""A stand-in for `helm` in sweep tests: appends each invocation's argv to $STAND_IN_HELM_LOG (one
JSON list per line), prints $STAND_IN_HELM_VALUES for `helm get values`, fails the Nth `upgrade`
when $STAND_IN_HELM_FAIL_UPGRADE=N (as a rollout that times out would) and POSTs each upgrade
that succeeds (its argv, JSON) to $STAND_IN_HELM_NOTIFY when set, so a scripted server can serve
as the release it was upgraded to."""

from __future__ import annotations

import json
import os
import sys
import urllib.request


def main() -> int:
    argv = sys.argv[1:]
    log = os.environ["STAND_IN_HELM_LOG"]
    with open(log, "a") as handle:
        handle.write(json.dumps(argv) + "\n")
    if argv[:2] == ["get", "values"]:
        print(os.environ.get("STAND_IN_HELM_VALUES", "{}"))
        return 0
    if argv[:1] == ["upgrade"]:
        fail = int(os.environ.get("STAND_IN_HELM_FAIL_UPGRADE", "0"))
        with open(log) as handle:
            upgrades = sum(1 for line in handle if json.loads(line)[:1] == ["upgrade"])
        if fail and upgrades == fail:
            print("Error: UPGRADE FAILED: context deadline exceeded", file=sys.stderr)
            return 1
        notify = os.environ.get("STAND_IN_HELM_NOTIFY")
        if notify:
            request = urllib.request.Request(notify, data=json.dumps(argv).encode(), method="POST")
            urllib.request.urlopen(request, timeout=30).close()
        return 0
    print(f"stand-in helm: unexpected {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
