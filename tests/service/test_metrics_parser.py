from __future__ import annotations

from dflash_sidecar import metrics_parser

from tests.service.conftest import raw_counter

KEY = (("engine", "0"), ("model_name", "tiny"))


def test_reads_the_counters_of_a_real_vllm_exposition(after_text: str) -> None:
    parsed = metrics_parser.parse(after_text)
    assert parsed.errors == []
    assert list(parsed.series) == [KEY]
    sample = parsed.series[KEY]
    assert sample.has_spec_decode
    assert sample.drafts == raw_counter(after_text, "vllm:spec_decode_num_drafts_total")
    assert sample.accepted == raw_counter(after_text, "vllm:spec_decode_num_accepted_tokens_total")
    assert sample.draft_tokens == raw_counter(after_text, "vllm:spec_decode_num_draft_tokens_total")
    assert sample.generation_tokens == raw_counter(after_text, "vllm:generation_tokens_total")
    positions = sorted(sample.accepted_per_pos)
    assert positions == list(range(len(positions))) and positions
    for i in positions:
        assert sample.accepted_per_pos[i] == raw_counter(
            after_text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", i
        )


def test_malformed_lines_are_counted_not_fatal(after_text: str) -> None:
    broken = after_text + (
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} banana\n'
        "vllm:generation_tokens_total{engine=\n"
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} NaN\n'
    )
    parsed = metrics_parser.parse(broken)
    assert len(parsed.errors) == 2  # the lines that do not parse
    # The good lines before the garbage still count; the repeated (NaN) series taints the sample.
    assert parsed.series[KEY].drafts == raw_counter(after_text, "vllm:spec_decode_num_drafts_total")
    assert parsed.series[KEY].problems == [
        "vllm:spec_decode_num_accepted_tokens_total appears twice"
    ]


def test_a_page_that_is_not_vllm_metrics() -> None:
    parsed = metrics_parser.parse("<html><body>502 Bad Gateway</body></html>\n")
    assert not parsed.is_vllm and parsed.series == {}


def test_engines_and_models_are_kept_apart(after_text: str, before_text: str) -> None:
    other = before_text.replace('model_name="tiny"', 'model_name="other"').replace(
        'engine="0"', 'engine="1"'
    )
    parsed = metrics_parser.parse(after_text + other)
    assert set(parsed.series) == {KEY, (("engine", "1"), ("model_name", "other"))}
    assert parsed.series[KEY].drafts == raw_counter(after_text, "vllm:spec_decode_num_drafts_total")
    assert parsed.series[(("engine", "1"), ("model_name", "other"))].drafts == raw_counter(
        before_text, "vllm:spec_decode_num_drafts_total"
    )


def test_server_without_speculative_metrics(after_text: str) -> None:
    plain = "\n".join(x for x in after_text.splitlines() if "spec_decode" not in x)
    parsed = metrics_parser.parse(plain)
    assert not parsed.series[KEY].has_spec_decode
    assert parsed.series[KEY].generation_tokens > 0


def test_escaped_label_values_are_unescaped(after_text: str) -> None:
    page = after_text.replace('model_name="tiny"', 'model_name="a \\"quoted\\" \\\\ path\\nname"')
    parsed = metrics_parser.parse(page)
    assert parsed.errors == []
    assert list(parsed.series) == [(("engine", "0"), ("model_name", 'a "quoted" \\ path\nname'))]


def test_crlf_leading_whitespace_and_timestamps(after_text: str) -> None:
    page = "\r\n".join(
        ("  \t" + line + " 1700000000000") if line.startswith("vllm:") else line
        for line in after_text.splitlines()
    )
    parsed = metrics_parser.parse(page)
    assert parsed.errors == []
    sample = parsed.series[KEY]
    assert sample.drafts == raw_counter(after_text, "vllm:spec_decode_num_drafts_total")
    assert sample.problems == []


def test_openmetrics_exemplars_do_not_change_the_value(after_text: str) -> None:
    page = after_text.replace(
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 500.0',
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 500.0 '
        '# {trace_id="4bf92f3577b34da6"} 7.0 1700000000.123',
    )
    assert page != after_text
    assert metrics_parser.parse(page).series[KEY].drafts == 500.0


def test_nan_gauges_are_values_not_errors(after_text: str) -> None:
    page = after_text.replace(
        'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
        'vllm:num_requests_running{engine="0",model_name="tiny"} NaN',
    )
    assert page != after_text
    parsed = metrics_parser.parse(page)
    assert parsed.errors == [] and parsed.series[KEY].problems == []


def test_names_inside_help_text_or_label_values_are_not_samples(after_text: str) -> None:
    page = (
        "# HELP x mentions vllm:spec_decode_num_drafts_total{} 9e9 in its help\n"
        'other_metric{note="vllm:generation_tokens_total 7"} 1\n' + after_text
    )
    sample = metrics_parser.parse(page).series[KEY]
    assert sample.drafts == raw_counter(after_text, "vllm:spec_decode_num_drafts_total")
    assert sample.problems == []


def test_a_duplicated_series_makes_the_sample_untrusted(after_text: str) -> None:
    line = next(x for x in after_text.splitlines() if x.startswith("vllm:generation_tokens_total"))
    sample = metrics_parser.parse(after_text + line.replace(" ", " 1", 1) + "\n").series[KEY]
    assert sample.problems == ["vllm:generation_tokens_total appears twice"]
