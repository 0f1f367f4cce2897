"""Alert rules (promtool), dashboards (structure, generated, parseable PromQL)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from dflash_ops.chart.helm import helm_template
from dflash_ops.observability import dashboards

from tests.conftest import REPO_ROOT, find_tool
from tests.ops.observability.promql_names import (
    ALL_SERIES_VARIABLES,
    DASHBOARD_DIR,
    RULES_DIR,
    dashboard_expressions,
    expand_grafana,
    metric_names,
    rule_expressions,
)


def test_promtool_checks_the_rules() -> None:
    files = [str(p) for p in RULES_DIR.glob("*.yaml")]
    result = subprocess.run(
        [find_tool("promtool"), "check", "rules", *files], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def chart_rules_dir(tmp_path: Path) -> Path:
    """The chart's rendered PrometheusRule as a rule file, beside a copy of the unit tests that
    point at it (release-scoped expressions: namespace ml, release dflash)."""
    text = helm_template([], [], "dflash", "ml")
    rule = next(d for d in yaml.safe_load_all(text) if d and d["kind"] == "PrometheusRule")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "dflash-serve.rules.yaml").write_text(
        yaml.safe_dump({"groups": rule["spec"]["groups"]})
    )
    (tmp_path / "tests").mkdir()
    for test in (REPO_ROOT / "ops" / "prometheus" / "tests").glob("*.yaml"):
        (tmp_path / "tests" / test.name).write_text(test.read_text())
    return tmp_path / "tests"


@pytest.mark.parametrize("rules", ["ops file", "chart render"])
def test_promtool_unit_tests_fire_and_stay_silent(rules: str, tmp_path: Path) -> None:
    directory = (
        REPO_ROOT / "ops" / "prometheus" / "tests"
        if rules == "ops file"
        else chart_rules_dir(tmp_path)
    )
    tests = sorted(directory.glob("*.yaml"))
    result = subprocess.run(
        [find_tool("promtool"), "test", "rules", *map(str, tests)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {name for name, _ in rule_expressions() if not name.startswith("dflash:")}
    tested = set(re.findall(r"alertname: (\w+)", "".join(t.read_text() for t in tests)))
    assert alerts == tested, f"alerts without promtool tests: {alerts - tested}"


def test_chart_scopes_every_rule_to_its_release() -> None:
    text = helm_template([], [], "dflash", "ml")
    rule = next(d for d in yaml.safe_load_all(text) if d and d["kind"] == "PrometheusRule")
    rendered = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    source = [expr for _, expr in rule_expressions()]
    assert len(rendered) == len(source)
    for before, after in zip(source, rendered, strict=True):
        assert 'release=~".+"' not in after
        assert after.count('namespace="ml", release="dflash"') == before.count('release=~".+"')


def test_every_alert_has_summary_description_and_a_runbook_section() -> None:
    runbook = (REPO_ROOT / "ops" / "prometheus" / "RUNBOOK.md").read_text()
    sections = {line[3:].strip().lower() for line in runbook.splitlines() if line.startswith("## ")}
    for path in RULES_DIR.glob("*.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                annotations = rule["annotations"]
                assert annotations["summary"] and annotations["description"], rule["alert"]
                anchor = annotations["runbook_url"].rsplit("#", 1)[1]
                assert anchor == rule["alert"].lower() and anchor in sections, rule["alert"]
                assert rule["labels"]["severity"] in ("warning", "critical")


@pytest.mark.parametrize("name", sorted(dashboards.DASHBOARDS))
def test_every_panel_has_unit_description_and_queries(name: str) -> None:
    board = json.loads((DASHBOARD_DIR / name).read_text())
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "namespace", "release", "pod", "model"} <= variables
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["description"], panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert panel["targets"], panel["title"]


def test_every_expression_parses_and_names_known_families() -> None:
    # vLLM's engine, ours, vLLM's router (vllm_router_*), Prometheus' own.
    known_prefixes = ("vllm:", "dflash_", "dflash:", "vllm_router_", "up")
    expressions = [e for _, e in rule_expressions()] + [
        expand_grafana(e, ALL_SERIES_VARIABLES) for _, _, e in dashboard_expressions()
    ]
    for expr in expressions:
        names = metric_names(expr)
        assert names and all(
            n.startswith(known_prefixes[:4]) or n in known_prefixes[4:] for n in names
        ), (expr, names)


def test_metric_name_extraction_sees_a_misspelling() -> None:
    assert metric_names("sum(rate(vllm:spec_decode_num_drafs_total[5m]))") == {
        "vllm:spec_decode_num_drafs_total"
    }


# Unit ids Grafana knows (grafana-data valueFormats/categories.ts: Misc, Time, Throughput), and
# the custom forms its getValueFormat accepts; anything else is printed as a literal suffix.
GRAFANA_UNITS = {
    "none", "string", "short", "percent", "percentunit", "sci", "locale",
    "ns", "µs", "ms", "s", "m", "h", "d", "dtdurationms", "dtdurations", "dthms", "dtdhms",
    "cps", "ops", "reqps", "rps", "wps", "iops", "cpm", "opm", "rpm", "wpm",
    "bytes", "decbytes", "Bps", "bps",
}  # fmt: skip
CUSTOM_UNIT = re.compile(r"^(prefix|suffix|si|count|currency|time):.+")
# Core Grafana panel plugins the dashboards may use.
PANEL_TYPES = {"timeseries", "barchart", "heatmap", "state-timeline", "stat", "gauge", "table"}


@pytest.mark.parametrize("name", sorted(dashboards.DASHBOARDS))
def test_panels_follow_grafanas_rules(name: str) -> None:
    board = json.loads((DASHBOARD_DIR / name).read_text())
    variables = {v["name"] for v in board["templating"]["list"]}
    assert "engine" in variables  # per-engine breakdown for data-parallel deployments
    for panel in board["panels"]:
        title, unit = panel["title"], panel["fieldConfig"]["defaults"]["unit"]
        assert panel["type"] in PANEL_TYPES, title
        assert unit in GRAFANA_UNITS or CUSTOM_UNIT.match(unit), f"{title}: unit {unit!r}"
        for target in panel["targets"]:
            expr = target["expr"]
            if panel["type"] == "barchart":
                # A bar per category needs one row each: an instant query as a table, with the
                # category field in the query's grouping.
                assert target.get("instant") is True and target.get("format") == "table", title
                assert "$__range" in expr and "$__rate_interval" not in expr, title
                assert f"by ({panel['options']['xField']})" in expr, title
            else:
                assert not target.get("instant"), title
            if " / " in expr:
                assert "> 0)" in expr, f"{title}: unguarded denominator in {expr}"
            if "vllm:" in expr and "$release" in expr:
                assert 'engine=~"$engine"' in expr, title


def test_grafana_unit_check_rejects_what_grafana_does_not_know() -> None:
    assert "tps" not in GRAFANA_UNITS and not CUSTOM_UNIT.match("tps")
    assert "bool" not in GRAFANA_UNITS and CUSTOM_UNIT.match("suffix: tok/s")


def test_recording_rules_use_the_sidecars_acceptance_formulas() -> None:
    """The rules file is written by hand; its acceptance figures must be exactly the formulas
    the dashboards and the sidecar share (dflash_sidecar.vllm_metrics)."""
    import promql_parser
    from dflash_sidecar import vllm_metrics as m

    by = "namespace, release, pod, model_name"

    def rate5m(family: str, labels: str = by) -> str:
        return f'sum by ({labels}) (rate({m.sample_name(family)}{{release=~".+"}}[5m]))'

    expected = {
        "dflash:spec_decode_mean_acceptance_length:rate5m": m.mean_acceptance_length(
            rate5m(m.ACCEPTED), rate5m(m.DRAFTS)
        ),
        "dflash:spec_decode_draft_acceptance_rate:rate5m": m.draft_acceptance_rate(
            rate5m(m.ACCEPTED), rate5m(m.DRAFT_TOKENS)
        ),
        "dflash:spec_decode_position_acceptance:rate5m": m.position_acceptance(
            rate5m(m.ACCEPTED_PER_POS, f"{by}, position"), rate5m(m.DRAFTS), match=by
        ),
    }
    recorded = {
        rule["record"]: rule["expr"]
        for group in yaml.safe_load((RULES_DIR / "dflash-serve.rules.yaml").read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    for record, expr in expected.items():
        assert str(promql_parser.parse(recorded[record])) == str(promql_parser.parse(expr)), record
