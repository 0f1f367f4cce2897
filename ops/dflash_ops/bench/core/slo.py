"""Service-level objectives for goodput, spelled as `vllm bench serve --goodput` spells them:
`ttft:MS tpot:MS e2el:MS` (separate words, or comma-separated; `e2e` is this project's older
name of e2el), each an upper bound in milliseconds. A request is good when it succeeded and
meets every objective given; goodput is good requests per second."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dflash_ops.bench.core.client import RequestRecord

OBJECTIVES = ("ttft", "tpot", "e2e")
VLLM_NAMES = {"e2el": "e2e"}  # vllm bench serve's name -> the one kept in results
MAX_MS = 7 * 24 * 3600 * 1000.0


def parse(text: str) -> dict[str, float]:
    """`ttft:500,tpot:50` -> {"ttft": 500.0, "tpot": 50.0}; an argparse type."""
    objectives: dict[str, float] = {}
    for part in text.replace(",", " ").split():
        name, sep, value = part.partition(":")
        name = VLLM_NAMES.get(name, name)
        if not sep or name not in OBJECTIVES:
            raise argparse.ArgumentTypeError(
                f"{part!r}: expected NAME:MS with NAME one of ttft, tpot, e2el, "
                "e.g. ttft:500 tpot:50"
            )
        try:
            ms = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: {value!r} is not milliseconds") from None
        if not math.isfinite(ms) or not 0 < ms <= MAX_MS:
            raise argparse.ArgumentTypeError(f"{part!r}: milliseconds must be above 0")
        if name in objectives:
            raise argparse.ArgumentTypeError(f"{part!r}: {name} is given twice")
        objectives[name] = ms
    if not objectives:
        raise argparse.ArgumentTypeError(f"{text!r}: expected e.g. ttft:500 tpot:50 e2el:10000")
    return objectives


class ObjectivesAction(argparse.Action):
    """`--goodput ttft:500 tpot:50` (vLLM's separate words) and `--goodput ttft:500,tpot:50`
    alike: each word parsed by `parse` (the argparse type), merged into one mapping."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        merged: dict[str, float] = {}
        parts: list[dict[str, float]] = values if isinstance(values, list) else [values]  # type: ignore[list-item]
        for part in parts:
            for name, ms in part.items():
                if name in merged:
                    parser.error(f"{option_string}: {name} is given twice")
                merged[name] = ms
        setattr(namespace, self.dest, merged)


def describe(objectives: dict[str, float]) -> str:
    return ", ".join(f"{name} <= {ms:g} ms" for name, ms in objectives.items())


def is_good(record: RequestRecord, objectives: dict[str, float]) -> bool:
    if not record.ok:
        return False
    measured = {
        "ttft": record.ttft_s,
        "tpot": record.tpot_s,
        "e2e": record.latency_s,
    }
    for name, limit_ms in objectives.items():
        value = measured[name]
        # One output token has no TPOT: it cannot miss that objective.
        if value is None:
            if name == "tpot":
                continue
            return False
        if value * 1000 > limit_ms:
            return False
    return True
