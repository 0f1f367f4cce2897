"""Read the speculative-decoding and throughput counters out of vLLM's Prometheus text.

Only the few families the sidecar needs are parsed; every other line is skipped with one
`startswith` test, which keeps a 3,000-line exposition well under a millisecond or two. A line
of a wanted family that does not parse is counted, never fatal.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"

_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS, GENERATION_TOKENS)
_GAUGES = (REQUESTS_RUNNING, REQUESTS_WAITING)
# Longest names first so the per-position family is not taken for the accepted-tokens one.
_WANTED = tuple(sorted(_COUNTERS + _GAUGES, key=len, reverse=True))
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

SeriesKey = tuple[tuple[str, str], ...]  # sorted (label, value) pairs, `position` excluded


@dataclass
class SeriesSample:
    """Counter values of one engine/model series at one scrape."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    generation_tokens: float = 0.0
    requests_running: float = 0.0
    requests_waiting: float = 0.0
    has_spec_decode: bool = False


@dataclass
class ParsedExposition:
    series: dict[SeriesKey, SeriesSample]
    vllm_lines: int  # lines of any vllm: family: zero means this is not a vLLM /metrics page
    errors: list[str]


def _family(name: str) -> str | None:
    for wanted in _WANTED:
        if name == wanted or name == wanted + "_total":
            return wanted
    return None


def parse(text: str) -> ParsedExposition:
    series: dict[SeriesKey, SeriesSample] = {}
    errors: list[str] = []
    vllm_lines = 0
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        vllm_lines += 1
        if not line.startswith(_WANTED):
            continue
        match = _LINE.match(line)
        family = _family(match.group(1)) if match else None
        if match is None or family is None:
            if match is None:
                errors.append(f"unparsable line: {line[:120]!r}")
            continue
        labels_text, value_text = match.group(2) or "", match.group(3)
        try:
            value = float(value_text)
        except ValueError:
            errors.append(f"bad value {value_text!r} in {family}")
            continue
        if math.isnan(value) or math.isinf(value) or (family in _COUNTERS and value < 0):
            errors.append(f"invalid value {value_text} in {family}")
            continue
        labels = dict(_LABEL.findall(labels_text))
        position = labels.pop("position", None)
        sample = series.setdefault(tuple(sorted(labels.items())), SeriesSample())
        if family == ACCEPTED_PER_POS:
            if position is None or not position.isdigit():
                errors.append(f"{family} without a numeric position label")
                continue
            sample.accepted_per_pos[int(position)] = value
            sample.has_spec_decode = True
        elif family == DRAFTS:
            sample.drafts, sample.has_spec_decode = value, True
        elif family == DRAFT_TOKENS:
            sample.draft_tokens = value
        elif family == ACCEPTED:
            sample.accepted = value
        elif family == GENERATION_TOKENS:
            sample.generation_tokens = value
        elif family == REQUESTS_RUNNING:
            sample.requests_running = value
        elif family == REQUESTS_WAITING:
            sample.requests_waiting = value
    return ParsedExposition(series=series, vllm_lines=vllm_lines, errors=errors)
