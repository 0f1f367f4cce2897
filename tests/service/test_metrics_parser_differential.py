"""The sidecar's fast parser against prometheus_client's reference parser, on generated pages.

Hypothesis writes pages the text format allows (escaped and unicode label values, leading
blanks, CRLF line ends, timestamps, NaN and infinite gauges, other families around ours) and
both parsers must read the same values for every series the sidecar uses.
"""

from __future__ import annotations

import math

from dflash_sidecar import metrics_parser
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted",
    "vllm:generation_tokens_total": "generation_tokens",
}
GAUGES = {
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"

label_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\r\x00"), max_size=12
)
counter_value = st.one_of(
    st.integers(min_value=0, max_value=10**12).map(float),
    st.floats(min_value=0, max_value=1e15, allow_nan=False, allow_infinity=False),
)
gauge_value = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 1000).map(float)
)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


@st.composite
def pages(draw: st.DrawFn) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """A page and the values the sidecar must read from it."""
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    blocks: list[list[str]] = []
    engines = draw(st.lists(st.tuples(label_text, label_text), min_size=1, max_size=3, unique=True))
    positions = draw(st.integers(0, 5))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    for name, kind in [
        *((n, "counter") for n in COUNTERS),
        *((n, "gauge") for n in GAUGES),
        (PER_POS, "counter"),
    ]:
        family = name.removesuffix("_total")
        block = [f"# HELP {family} help text mentioning {name} 1.0", f"# TYPE {family} {kind}"]
        for engine, model in engines:
            key = (("engine", engine), ("model_name", model))
            labels = f'engine="{escape(engine)}",model_name="{escape(model)}"'
            targets = (
                [("", None)]
                if name != PER_POS
                else [(f',position="{i}"', i) for i in range(positions)]
            )
            for extra, position in targets:
                value = draw(gauge_value if kind == "gauge" else counter_value)
                indent = draw(st.sampled_from(["", " ", "\t", "  "]))
                stamp = draw(st.sampled_from(["", " 1700000000000"]))
                order = draw(st.booleans())
                label_block = (
                    labels + extra
                    if order
                    else f'model_name="{escape(model)}"{extra},engine="{escape(engine)}"'
                )
                block.append(f"{indent}{name}{{{label_block}}} {render_value(value)}{stamp}")
                sample_name = name if position is None else f"{name}[{position}]"
                expected[(sample_name, key)] = value
        blocks.append(block)
    blocks.append(["# TYPE other_histogram histogram", 'other_histogram_bucket{le="+Inf"} 3'])
    order = draw(st.permutations(range(len(blocks))))
    text = eol.join(line for i in order for line in blocks[i]) + eol
    return text, expected


def reference_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in COUNTERS and sample.name not in GAUGES and sample.name != PER_POS:
                continue
            labels = dict(sample.labels)
            position = labels.pop("position", None)
            name = sample.name if position is None else f"{sample.name}[{position}]"
            values[(name, tuple(sorted(labels.items())))] = float(sample.value)
    return values


def sidecar_values(
    parsed: metrics_parser.ParsedExposition,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    values = {}
    for key, sample in parsed.series.items():
        for name, attribute in COUNTERS.items():
            values[(name, key)] = getattr(sample, attribute)
        for name, attribute in GAUGES.items():
            values[(name, key)] = getattr(sample, attribute)
        for position, value in sample.accepted_per_pos.items():
            values[(f"{PER_POS}[{position}]", key)] = value
    return values


@settings(max_examples=300, deadline=None)
@given(pages())
def test_the_sidecar_reads_what_prometheus_client_reads(
    page: tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]],
) -> None:
    text, expected = page
    reference = reference_values(text)
    parsed = metrics_parser.parse(text)
    ours = sidecar_values(parsed)
    assert parsed.errors == []
    assert all(s.problems == [] for s in parsed.series.values())
    for key, value in reference.items():
        assert expected[key] == value or (math.isnan(value) and math.isnan(expected[key]))
        if math.isfinite(value):
            assert ours[key] == value, key
        else:  # a NaN or infinite gauge is not used (and not an error)
            assert key[0] in GAUGES and ours[key] == 0.0
    assert {k for k in ours if k[0] != "vllm:num_requests_running"} >= {
        k for k in reference if k[0] in COUNTERS or k[0] == PER_POS
    }
