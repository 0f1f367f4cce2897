"""`dflash-serve bench sidecar`: the cost of the sidecar's scrape cycle and its memory over time."""

from __future__ import annotations

import argparse
from typing import Any

from dflash_ops.cli.arguments import number


def register(actions: Any) -> None:
    sidecar = actions.add_parser(
        "sidecar",
        help="cost of one sidecar scrape cycle on a ~3,000-line exposition, and memory over a day",
    )
    sidecar.add_argument("--cycles", type=number(int, 1, 1_000_000), default=2000)
    sidecar.add_argument("--hours", type=number(float, 0, 24 * 31, low_open=True), default=24.0)
    sidecar.add_argument("--scrape-interval", type=number(float, 0.01, 60.0), default=2.0)
    sidecar.set_defaults(handler=run_sidecar_cost)


def run_sidecar_cost(args: argparse.Namespace) -> int:
    from dflash_ops.bench.sidecar_cost import measure

    cost = measure(args.cycles, args.hours, args.scrape_interval)
    print(cost.model_dump_json(indent=2))
    print(
        f"scrape+parse+window update on {cost.exposition_lines} lines: p50 {cost.p50_ms:.2f} ms, "
        f"p99 {cost.p99_ms:.2f} ms; parse alone {cost.parse_p50_ms:.2f} ms vs "
        f"prometheus_client's parser {cost.reference_parse_p50_ms:.2f} ms (p50); RSS over "
        f"{cost.simulated_hours:g} h of {cost.scrape_interval:g} s scrapes: "
        + ", ".join(f"{k} {v:.1f} MB" for k, v in cost.rss_mb.items())
        + f" (largest page: {cost.largest_page_bytes / 2**20:g} MiB, --max-page-bytes)"
    )
    return 0
