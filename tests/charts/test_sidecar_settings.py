"""The sidecar container the chart renders, read by its consumer: every DFLASH_SIDECAR_*
variable is a setting the sidecar knows, named by the one rule (variable = DFLASH_SIDECAR_ +
NAME, value = sidecar.nameInCamelCase), and the sidecar's own flag and variable parsing accepts
the container's arguments and environment."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from dflash_ops.chart.helm import helm_template
from dflash_ops.chart.sidecar_rules import FROM_ELSEWHERE
from dflash_ops.chart.values import chart_values
from dflash_ops.cli import build_parser
from dflash_ops.cli.sidecar import settings_from
from dflash_ops.errors import UserError
from dflash_sidecar.settings import settings_spec


def sidecar_container(sets: list[str], values: list[Path] | None = None) -> dict[str, Any]:
    render = helm_template(values or [], sets, "dflash", "llm")
    deployment = next(d for d in yaml.safe_load_all(render) if d and d["kind"] == "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "sidecar")


def value_at(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for key in dotted.split("."):
        node = node[key]
    return node


@pytest.mark.parametrize("sets", [[], ["sidecar.kubernetesEvents=true"]], ids=["default", "events"])
def test_every_variable_is_a_setting_named_by_the_rule(sets: list[str]) -> None:
    spec = {s.variable: s for s in settings_spec()}
    values = chart_values([])
    env = sidecar_container(sets)["env"]
    for item in env:
        setting = spec.get(item["name"])
        assert setting is not None, f"{item['name']} is not a sidecar setting"
        if setting.name in FROM_ELSEWHERE:
            continue
        rendered, value = yaml.safe_load(item["value"]), value_at(values, setting.chart_value)
        assert rendered == value, (setting.name, rendered, value)


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["sidecar.kubernetesEvents=true"],
        ["sidecar.logLevel=debug", "sidecar.canaryInterval=30"],
    ],
    ids=["default", "events", "tuned"],
)
def test_the_sidecar_accepts_its_container(sets: list[str]) -> None:
    container = sidecar_container(sets)
    env = {
        item["name"]: str(item.get("value", "from-the-downward-api")) for item in container["env"]
    }
    args = build_parser().parse_args(container["args"])
    settings = settings_from(args, env)
    assert settings.port == int(container["ports"][0]["containerPort"])
    assert settings.kubernetes_events == ("sidecar.kubernetesEvents=true" in sets)


# Values a user might write for each setting the chart passes on (as YAML scalars: numbers stay
# numbers, text stays text), the edges of every limit among them.
GRID: dict[str, list[Any]] = {
    "sidecar.port": [0, 1, 8000, 9101, 65535, 65536, "9100", "x"],
    "sidecar.scrapeInterval": [0, -1, 0.5, "0.5", ".5", 2, 60, 61, "1e1", "abc", "", "inf", "nan"],
    "sidecar.scrapeTimeout": [0, 0.1, 3.9, 4, "-0", "x"],
    "sidecar.canaryInterval": [0, 1, "1e3", -5, "Infinity"],
    "sidecar.windows": [
        "1m,15m",
        "1m, 5m,15m",
        "5m",
        "",
        ",",
        "1x,5m",
        "0m,5m",
        "3s,5m",
        "4s,5m",
        "5m,1.5m",
        ".5m,5m",
        "\u0663m,5m",
        "5m,5m",
        "5 m",
        "1h",
    ],
    "sidecar.verdictWindow": ["1m", "15m", "2m", "", "5m ", "5M"],
    "sidecar.logLevel": ["debug", "error", "DEBUG", "verbose", ""],
    "sidecar.thresholds.minDrafts": [0, 1, 1000, 1.5, "3", -2],
    "sidecar.thresholds.collapsedMeanAcceptanceLength": [1, 1.01, 2, 2.5, "x"],
    "sidecar.thresholds.degradedMeanAcceptanceLength": [1.1, 1.2, 3, "1.5"],
    "sidecar.thresholds.collapsedPosition0": [-0.1, 0, 0.4, 0.5, 1.1],
    "sidecar.thresholds.degradedPosition0": [0, 0.05, 0.1, 1, 1.5],
    "probes.liveness.engineDownSeconds": [0, 10, 30, -1],
    "probes.liveness.notGeneratingSeconds": [0, 60, 600],
}
# Values the chart refuses although the sidecar alone would take them: rules of the chart's own.
CHART_ONLY = {
    ("sidecar.port", 8000): "the engine's port (the pod shares one network namespace)",
    ("probes.liveness.engineDownSeconds", 0): "probe timing: below 10 s a restart is too eager",
    ("probes.liveness.notGeneratingSeconds", 0): "probe timing: at least one canary interval",
    # A quoted whole number: `--set` gives integers as integers, and the schema names the value.
    ("sidecar.port", "9100"): "a whole number in quotes",
    ("sidecar.thresholds.minDrafts", "3"): "a whole number in quotes",
}


def nested(path: str, value: Any) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    return {head: nested(rest, value) if rest else value}


def go_text(value: Any) -> str:
    """What the chart's `quote` makes of a YAML scalar (Go's formatting of it)."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def chart_answer(path: str, value: Any, tmp_path: Path) -> tuple[dict[str, Any] | None, str]:
    values = tmp_path / f"{abs(hash((path, repr(value))))}.yaml"
    values.write_text(json.dumps(nested(path, value)))
    try:
        return sidecar_container([], [values]), ""
    except UserError as err:
        return None, str(err)


def sidecar_answer(container: dict[str, Any] | None, path: str, value: Any) -> str | None:
    """None when the sidecar starts with this container (or, for a refused value, with the
    default container and this value in its place), else why not."""
    base = container or sidecar_container([])
    env = {item["name"]: str(item.get("value", "downward-api")) for item in base["env"]}
    args = list(base["args"])
    if container is None:
        setting = next(
            s for s in settings_spec() if FROM_ELSEWHERE.get(s.name, s.chart_value) == path
        )
        if setting.name == "port":
            args[args.index("--port") + 1] = go_text(value)
        else:
            env[setting.variable] = go_text(value)
    try:
        settings_from(build_parser().parse_args(args), env)
    except (UserError, ValueError, SystemExit) as err:
        return str(err) or type(err).__name__
    return None


CASES = [(path, value) for path, values in GRID.items() for value in values]


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Any]:
    tmp_path = tmp_path_factory.mktemp("grid")
    with ThreadPoolExecutor(8) as pool:
        rendered = list(pool.map(lambda case: chart_answer(*case, tmp_path), CASES))
    return {(p, repr(v)): r for (p, v), r in zip(CASES, rendered, strict=True)}


@pytest.mark.parametrize(("path", "value"), CASES, ids=[f"{p}={v!r}" for p, v in CASES])
def test_the_chart_refuses_exactly_what_the_sidecar_refuses(
    answers: dict[tuple[str, str], Any], path: str, value: Any
) -> None:
    container, chart_error = answers[(path, repr(value))]
    sidecar_error = sidecar_answer(container, path, value)
    if container is not None:
        assert sidecar_error is None, f"the chart rendered {path}={value!r}: {sidecar_error}"
        return
    assert path.split(".")[-1] in chart_error or path in chart_error, chart_error
    if (path, value) in CHART_ONLY:
        return
    assert sidecar_error is not None, f"the chart refused {path}={value!r}: {chart_error}"
