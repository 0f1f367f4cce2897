"""`dflash-serve bench compare`: several runs side by side, with ratios to the first."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dflash_ops.errors import UserError


def register(actions: Any) -> None:
    compare = actions.add_parser(
        "compare", help="print several runs side by side, with ratios to the first"
    )
    compare.add_argument(
        "runs",
        type=Path,
        nargs="+",
        metavar="RUN",
        help="results.json files or their directories; the first is the baseline (e.g. MTP-3)",
    )
    compare.add_argument(
        "--different-workloads",
        action="store_true",
        help="put runs of different workloads (sampling, dataset, lengths) side by side anyway: "
        "each run whose workload differs from the baseline's is marked (*), the differences "
        "listed; without it such runs are refused",
    )
    compare.set_defaults(handler=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from dflash_ops.bench.core import report
    from dflash_ops.bench.core.result_file import read_result
    from dflash_ops.bench.core.results import BenchResult
    from dflash_ops.files import read_text

    if len(args.runs) < 2:
        raise UserError("bench compare needs at least two runs (the first is the baseline)")
    loaded = []
    for given in args.runs:
        path = _results_path(given)
        text = read_text(path, "results (a results.json or its directory)")
        try:
            BenchResult.model_validate_json(text)
            result = read_result(path)  # a run killed mid-way reads `died`, not `running`
        except ValidationError as err:
            detail = err.errors()[0]["msg"]
            raise UserError(f"{path} is not a dflash-serve results.json: {detail}") from None
        loaded.append((_results_path(given).parent.name or str(given), result))
    try:
        print(report.compare(loaded, args.different_workloads))
    except report.DifferentWorkloads as err:
        raise UserError(f"{err}; pass --different-workloads to compare them anyway") from None
    except ValueError:
        levels = "; ".join(
            f"{name}: {', '.join(lv.label for lv in r.levels) or 'none'}" for name, r in loaded
        )
        raise UserError(f"the runs share no load level ({levels})") from None
    return 0


def _results_path(path: Path) -> Path:
    return path / "results.json" if path.is_dir() else path
