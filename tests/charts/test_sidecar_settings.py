"""The sidecar container the chart renders, read by its consumer: every DFLASH_SIDECAR_*
variable is a setting the sidecar knows, named by the one rule (variable = DFLASH_SIDECAR_ +
NAME, value = sidecar.nameInCamelCase), and the sidecar's own flag and variable parsing accepts
the container's arguments and environment."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from dflash_ops.chart.helm import helm_template
from dflash_ops.chart.values import chart_values
from dflash_ops.cli import build_parser
from dflash_ops.cli.sidecar import settings_from
from dflash_sidecar.settings import settings_spec

# Set from other values than sidecar.*: the probes own these, the downward API the pod.
FROM_ELSEWHERE = {
    "engine_down_grace": "probes.liveness.engineDownSeconds",
    "not_generating_grace": "probes.liveness.notGeneratingSeconds",
    "startup_budget": "probes.startup (periodSeconds x failureThreshold)",
    "kubernetes_events": "sidecar.kubernetesEvents",
    "pod_name": "downward API",
    "pod_namespace": "downward API",
}


def sidecar_container(sets: list[str]) -> dict[str, Any]:
    render = helm_template([], sets, "dflash", "llm")
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
