"""Read the speculative-decoding and throughput counters out of vLLM's Prometheus text.

Only the few families the sidecar needs are parsed: `str.find` jumps from one of their lines to
the next, so the hundreds of histogram lines of a large exposition cost almost nothing. A line
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
    is_vllm: bool  # any vllm: series at all; False means this is not a vLLM /metrics page
    errors: list[str]


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+\S+)?[ \t]*$")
_FAMILY = {
    "vllm:spec_decode_num_drafts_total": DRAFTS,
    "vllm:spec_decode_num_draft_tokens_total": DRAFT_TOKENS,
    "vllm:spec_decode_num_accepted_tokens_total": ACCEPTED,
    "vllm:spec_decode_num_accepted_tokens_per_pos_total": ACCEPTED_PER_POS,
    "vllm:generation_tokens_total": GENERATION_TOKENS,
    "vllm:num_requests_running": REQUESTS_RUNNING,
    "vllm:num_requests_waiting": REQUESTS_WAITING,
}
# Line prefixes worth looking at; `str.find` jumps between them at C speed.
_NEEDLES = tuple(
    "\n" + p
    for p in (
        "vllm:spec_decode_num_",
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    )
)


def _candidate_lines(text: str) -> list[str]:
    padded = "\n" + text
    lines = []
    for needle in _NEEDLES:
        pos = padded.find(needle)
        while pos != -1:
            end = padded.find("\n", pos + 1)
            end = len(padded) if end == -1 else end
            lines.append(padded[pos + 1 : end])
            pos = padded.find(needle, end)
    return lines


def parse(text: str) -> ParsedExposition:
    series: dict[SeriesKey, SeriesSample] = {}
    errors: list[str] = []
    for line in _candidate_lines(text):
        if line.startswith("vllm:spec_decode_num_") and "_created" in line.split("{", 1)[0]:
            continue  # prometheus_client's creation-time samples
        match = _LINE.match(line)
        family = _FAMILY.get(match.group(1)) if match else None
        if match is None or family is None:
            if match is None:
                errors.append(f"unparsable line: {line[:120]!r}")
            continue
        labels_text, value_text = match.group(2), match.group(3)
        try:
            value = float(value_text)
        except ValueError:
            errors.append(f"bad value {value_text!r} in {family}")
            continue
        if math.isnan(value) or math.isinf(value) or (family in _COUNTERS and value < 0):
            errors.append(f"invalid value {value_text} in {family}")
            continue
        labels = dict(_LABEL.findall(labels_text)) if labels_text else {}
        position = labels.pop("position", None)
        key = tuple(sorted(labels.items()))
        sample = series.get(key)
        if sample is None:
            sample = series[key] = SeriesSample()
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
    is_vllm = text.startswith("vllm:") or "\nvllm:" in text
    return ParsedExposition(series=series, is_vllm=is_vllm, errors=errors)
