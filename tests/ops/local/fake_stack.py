"""`dflash-serve` with every part of the local stack replaced by tests.ops.local.fake_part (a
small HTTP server, each engine with a helper that blanks its environment), and nothing built or
checked that a stand-in does not need: the stack's own bookkeeping (state.json, the lock,
restarts, signals, down) on real processes and ports, in a second instead of a minute.

    python -m tests.ops.local.fake_stack --delay-seed N local up --state-dir D ...
"""

from __future__ import annotations

import dataclasses
import random
import sys

from dflash_ops.cli import main
from dflash_ops.local import stack


def patch(delay_seed: int) -> None:
    rng = random.Random(delay_seed)
    original = stack._components

    def components(config: stack.StackConfig) -> list[stack.Component]:
        parts = []
        for component in original(config):
            argv = [sys.executable, "-m", "tests.ops.local.fake_part",
                    "--port", str(component.port), "--model", config.served_model,
                    "--delay", f"{rng.uniform(0.05, 0.6):.2f}",
                    "--tag", str(config.state_dir)]  # fmt: skip
            if stack.kind_of(component.name) == "engine":
                argv.append("--helper")
            parts.append(dataclasses.replace(component, argv=argv, env=None, cwd=None, title=None))
        return parts

    stack._components = components  # type: ignore[assignment]
    for name in ("_check_engine_installed", "_check_shared_memory", "ensure_models"):
        setattr(stack, name, lambda *a, **k: None)


if __name__ == "__main__":
    patch(int(sys.argv[2]) if sys.argv[1:2] == ["--delay-seed"] else 0)
    words = sys.argv[3:] if sys.argv[1:2] == ["--delay-seed"] else sys.argv[1:]
    sys.exit(main(words))
