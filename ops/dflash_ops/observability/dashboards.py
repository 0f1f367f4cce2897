"""Grafana dashboards for dflash-serve, generated so every panel has a unit and a description.

    make generate      # rewrites ops/grafana/dashboards/*.json with the other generated files

The committed JSON is what Grafana (and the chart's ConfigMaps) load; a test regenerates it and
requires it unchanged, and the Prometheus end-to-end test runs every query against a real
Prometheus scraping a real vLLM CPU engine and sidecar.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from dflash_ops.observability.serving_dashboard import serving
from dflash_ops.observability.speculative_dashboard import speculative_decoding

DASHBOARDS: dict[str, Callable[[], dict[str, Any]]] = {
    "speculative-decoding.json": speculative_decoding,
    "serving.json": serving,
}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}
