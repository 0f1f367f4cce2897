"""`dflash-serve bench step-cost`: the step-cost model a sweep fits, and how well it predicts
another sweep (other sampling, other traffic) from that sweep's acceptance and running batch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(actions: Any) -> None:
    step_cost = actions.add_parser(
        "step-cost",
        help="fit the step-cost model of a finished sweep (what the sidecar's schedule "
        "recommendation predicts with) and test it on another sweep",
    )
    step_cost.add_argument("sweep", type=Path, metavar="DIR", help="a finished bench sweep --out")
    step_cost.add_argument(
        "--against",
        type=Path,
        metavar="DIR",
        help="another finished sweep: predict each of its measurements from its own acceptance "
        "and running batch",
    )
    step_cost.set_defaults(handler=run_step_cost)


def run_step_cost(args: argparse.Namespace) -> int:
    from dflash_ops.bench.sweep.step_cost_report import report

    sys.stdout.write(report(args.sweep, args.against))
    return 0
