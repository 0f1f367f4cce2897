"""Read the speculative-decoding and throughput counters out of vLLM's Prometheus text.

Only the few families the sidecar needs are parsed: `str.find` jumps from one of their names to
the next, so the hundreds of histogram lines of a large exposition cost almost nothing. What is
parsed follows the text format (and prometheus_client's reader of it): leading whitespace and
CRLF line ends, escaped label values (`\\\\`, `\\"`, `\\n`), an optional timestamp, and an
OpenMetrics exemplar after ` # `. A line of a wanted family that does not parse, a counter that
is NaN, infinite or negative, and a series that appears twice are recorded as problems of the
sample (the monitor drops such a sample for that scrape); a NaN gauge is a legitimate value and
is simply not used. Time and memory stay bounded whatever the page: a line longer than MAX_LINE
or a label value longer than MAX_LABEL_VALUE is an error (no regular expression ever runs over
more than one bounded line, so a parse in a worker thread hands the GIL back often), and label
sets beyond `max_series` are only counted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from dflash_sidecar.vllm_metrics import (
    ACCEPTED,
    ACCEPTED_PER_POS,
    COUNTERS,
    DRAFT_TOKENS,
    DRAFTS,
    GAUGES,
    REQUESTS_RUNNING,
    sample_name,
)

# Sample name in the exposition -> family.
_FAMILY = {sample_name(family): family for family in COUNTERS | GAUGES}
SPEC_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED)
# Name prefixes worth looking at; `str.find` jumps between them at C speed.
_NEEDLES = (
    "vllm:spec_decode_num_",
    "vllm:generation_tokens_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)
_NAME_END = re.compile(r"[{ \t\r]")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,?)')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_VLLM_LINE = re.compile(r"(?m)^[ \t]*vllm:")

SeriesKey = tuple[tuple[str, str], ...]  # sorted (label, value) pairs, `position` excluded
MAX_LABEL_VALUE = 1024  # characters; vLLM's model names and engine indexes are far shorter
MAX_LINE = 4096  # characters of one sample line: longer ones are errors, never matched
MAX_ERRORS = 16  # error lines kept per page (the rest are only counted)


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
    present: set[str] = field(default_factory=set)  # counter families seen for this series
    problems: list[str] = field(default_factory=list)  # why this sample cannot be trusted


@dataclass
class ParsedExposition:
    series: dict[SeriesKey, SeriesSample]
    is_vllm: bool  # any vllm: series at all; False means this is not a vLLM /metrics page
    errors: list[str]  # lines of wanted families that do not parse (the first MAX_ERRORS)
    error_count: int = 0
    overflow: int = 0  # label sets beyond max_series, not read


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(0)), value)


def _parse_labels(text: str, start: int) -> tuple[dict[str, str], int] | None:
    """Labels from `text[start:]` (just after `{`) up to the closing `}`: (labels, index after
    `}`), or None when they do not parse."""
    labels: dict[str, str] = {}
    pos = start
    while True:
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and text[pos] == "}":
            return labels, pos + 1
        match = _LABEL.match(text, pos)
        if match is None:
            return None
        name, value, comma = match.groups()
        if name in labels or len(value) > MAX_LABEL_VALUE:
            return None
        labels[name] = _unescape(value)
        pos = match.end()
        if not comma:
            while pos < len(text) and text[pos] in " \t":
                pos += 1
            return (labels, pos + 1) if pos < len(text) and text[pos] == "}" else None


def _parse_value(text: str) -> float | None:
    """The sample value of the text after the labels: `value [timestamp] [# exemplar]`."""
    exemplar = text.find(" # ")
    if exemplar != -1:
        text = text[:exemplar]
    parts = text.split()
    if not parts or len(parts) > 2 or "_" in parts[0]:
        return None
    try:
        return float(parts[0])
    except ValueError:
        return None


def _candidate_lines(text: str) -> Iterator[str]:
    """Lines of `text` whose metric name starts with one of the needles (after optional
    leading blanks); never a needle inside a label value, a HELP text or a comment. One line at
    a time: a large page is never copied whole."""
    for needle in _NEEDLES:
        pos = text.find(needle)
        while pos != -1:
            line_start = text.rfind("\n", 0, pos) + 1
            end = text.find("\n", pos)
            end = len(text) if end == -1 else end
            if pos == line_start or not text[line_start:pos].strip(" \t"):
                yield text[pos:end]
            pos = text.find(needle, end)


def parse(text: str, max_series: int = 256) -> ParsedExposition:
    series: dict[SeriesKey, SeriesSample] = {}
    errors: list[str] = []
    error_count = 0
    overflow: set[int] = set()  # hashes of the label sets beyond max_series
    seen: set[tuple[str, SeriesKey, str | None]] = set()

    def error(message: str) -> None:
        nonlocal error_count
        error_count += 1
        if len(errors) < MAX_ERRORS:
            errors.append(message)

    for line in _candidate_lines(text):
        if len(line) > MAX_LINE:
            error(f"line longer than {MAX_LINE} characters: {line[:120]!r}...")
            continue
        line = line.rstrip(" \t\r")
        match = _NAME_END.search(line)
        name = line[: match.start()] if match else line
        family = _FAMILY.get(name)
        if family is None:  # `_created` samples, families the sidecar does not read
            continue
        labels: dict[str, str] = {}
        rest_at = len(name)
        if rest_at < len(line) and line[rest_at] == "{":
            parsed_labels = _parse_labels(line, rest_at + 1)
            if parsed_labels is None:
                error(f"unparsable labels: {line[:120]!r}")
                continue
            labels, rest_at = parsed_labels
        value = _parse_value(line[rest_at:])
        if value is None:
            error(f"unparsable value: {line[:120]!r}")
            continue
        position = labels.pop("position", None)
        key: SeriesKey = tuple(sorted(labels.items()))
        sample = series.get(key)
        if sample is None:
            if len(series) >= max_series:
                overflow.add(hash(key))
                continue
            sample = series[key] = SeriesSample()
        identity = (family, key, position)
        if identity in seen:
            sample.problems.append(f"{name} appears twice")
            continue
        seen.add(identity)
        if family not in COUNTERS:
            if math.isfinite(value):
                if family == REQUESTS_RUNNING:
                    sample.requests_running = value
                else:
                    sample.requests_waiting = value
            continue
        if not math.isfinite(value) or value < 0:
            sample.problems.append(f"{name} is {value}")
            continue
        if family == ACCEPTED_PER_POS:
            if position is None or not position.isdigit():
                sample.problems.append(f"{name} without a numeric position label")
                continue
            sample.accepted_per_pos[int(position)] = value
            sample.has_spec_decode = True
        elif family == DRAFTS:
            sample.drafts, sample.has_spec_decode = value, True
        elif family == DRAFT_TOKENS:
            sample.draft_tokens, sample.has_spec_decode = value, True
        elif family == ACCEPTED:
            sample.accepted, sample.has_spec_decode = value, True
        else:
            sample.generation_tokens = value
        sample.present.add(family)
    is_vllm = _VLLM_LINE.search(text) is not None
    return ParsedExposition(
        series=series,
        is_vllm=is_vllm,
        errors=errors,
        error_count=error_count,
        overflow=len(overflow),
    )
