"""Free-form values cannot change the structure of a render, and numbers may come as strings.

The values are found in values.schema.json, not listed by hand: every string without an enum or
a pattern, every map of strings, and every number that `helm --set` would hand over as a string.
A YAML parser (the API server's) must see the same documents with a hostile value as with a
plain one, the hostile text only where the plain one was; or the chart refuses the value by
name.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from dflash_ops.chart.helm import helm_template
from dflash_ops.chart.values import chart_values
from dflash_ops.errors import UserError
from dflash_ops.paths import CHART_DIR

from tests.charts.conftest import RWX

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())
HOSTILE = "v\"\n  hostNetwork: true # {x: [1]}\n- y: 'z"
PLAIN = "plain-value"
# Values only rendered in some layouts: the sets that make the chart render them.
LAYOUT = {
    "autoscaling.prometheusAddress": ["autoscaling.enabled=true", RWX],
    "autoscaling.podsMetricName": ["autoscaling.enabled=true", "autoscaling.engine=hpa", RWX],
    "networkPolicy": ["networkPolicy.enabled=true", "distributed.enabled=true", RWX],
    "model.hfTokenSecret.key": ["model.hfTokenSecret.name=hf"],
    "serviceAccount.name": ["serviceAccount.create=false"],
    "modelCache.storageClass": [],
    # A whole baseline, so that the one field under test (given in the values file, not --set)
    # reaches the render.
    "sidecar.baseline": [
        "sidecar.baseline.model=qwen3.8-flash-next",
        "sidecar.baseline.num_speculative_tokens=7",
        "sidecar.baseline.mean_acceptance_length=2",
        "sidecar.baseline.per_position_acceptance={1,1,0,0,0,0,0}",  # --set: no floats
        "sidecar.baseline.sampling=greedy",
    ],
}


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
        return {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def free_strings(node: dict[str, Any], path: list[str]) -> list[str]:
    """Dotted paths of free-form strings ([] for a list item, * for a map value)."""
    node = resolve(node)
    kind = node.get("type")
    if kind == "object" or "properties" in node:
        found = []
        for key, child in node.get("properties", {}).items():
            found += free_strings(child, [*path, key])
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            found += free_strings(extra, [*path, "*"])
        return found
    if kind == "array":
        return free_strings(node.get("items", {}), [*path, "[]"])
    kinds = kind if isinstance(kind, list) else [kind]
    if "string" in kinds and not {"enum", "pattern", "format", "const"} & set(node):
        return [".".join(path)]
    return []


def decimals(node: dict[str, Any], path: list[str]) -> list[str]:
    """Dotted paths of numbers the schema also takes as numeric strings."""
    if node.get("$ref") == "#/$defs/decimal":
        return [".".join(path)]
    node = resolve(node)
    found = []
    for key, child in node.get("properties", {}).items():
        found += decimals(child, [*path, key])
    return found


FREE = free_strings(SCHEMA, [])
# Maps rendered with toYaml whose keys are free too: a hostile value must stay a value.
MAPS = [
    "service.annotations",
    "nodeSelector",
    "podAnnotations",
    "podLabels",
    "serviceAccount.annotations",
    "monitoring.labels",
    "monitoring.grafanaDashboards.labels",
    "monitoring.grafanaDashboards.annotations",
    "networkPolicy.allowedNamespaceLabels",
]


def nested(path: str, value: Any) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    if head == "[]" or head == "*":
        raise AssertionError(path)
    if rest.startswith("[]"):
        return {head: [nested(rest[3:], value) if rest[3:] else value]}
    if rest == "*":
        return {head: {"k": value}}
    return {head: nested(rest, value) if rest else value}


def replace_strings(node: Any, old: str, new: str) -> Any:
    if isinstance(node, dict):
        return {replace_strings(k, old, new): replace_strings(v, old, new) for k, v in node.items()}
    if isinstance(node, list):
        return [replace_strings(v, old, new) for v in node]
    if isinstance(node, str):
        # Also where the value sits JSON-encoded inside a string (--speculative-config).
        escaped_old, escaped_new = json.dumps(old)[1:-1], json.dumps(new)[1:-1]
        return node.replace(old, new).replace(escaped_old, escaped_new)
    return node


def render_with(path: str, value: str, tmp_path: Path) -> list[Any] | str:
    """The parsed documents, or the chart's refusal."""
    target = path.removesuffix(".*").removesuffix(".[]")
    values = tmp_path / f"{abs(hash((path, value)))}.yaml"
    document = nested(path + ".*", value) if path in MAPS else nested(path, value)
    values.write_text(json.dumps(document))
    sets = next((s for prefix, s in LAYOUT.items() if target.startswith(prefix)), [])
    sets = [s for s in sets if not s.startswith(target + "=")]  # the values file gives it
    try:
        text = helm_template([values], sets, "dflash", "llm")
    except UserError as err:
        return str(err)
    return [d for d in yaml.safe_load_all(text) if d]


CASES = sorted(set(FREE) | set(MAPS))


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Any]]:
    tmp_path = tmp_path_factory.mktemp("values")

    def both(path: str) -> tuple[Any, Any]:
        return render_with(path, HOSTILE, tmp_path), render_with(path, PLAIN, tmp_path)

    with ThreadPoolExecutor(8) as pool:
        return dict(zip(CASES, pool.map(both, CASES), strict=True))


def test_the_schema_walk_finds_the_free_values() -> None:
    for path in ("priorityClassName", "model.servedName", "image.engine.repository"):
        assert path in FREE
    assert "model.extraArgs.[]" in FREE and "gpu.products.[]" in FREE


@pytest.mark.parametrize("path", CASES)
def test_a_hostile_value_stays_a_value(outcomes: dict[str, tuple[Any, Any]], path: str) -> None:
    hostile, plain = outcomes[path]
    last = path.removesuffix(".*").removesuffix(".[]").rsplit(".", 1)[-1]
    if isinstance(hostile, str):  # refused: the message must name the value
        assert last in hostile or last.lower() in hostile.lower(), hostile
        return
    assert not isinstance(plain, str), f"the plain value was refused: {plain}"
    assert replace_strings(hostile, HOSTILE, PLAIN) == plain, (
        f"{path} changed the render's structure"
    )


@pytest.mark.parametrize("path", decimals(SCHEMA, []))
def test_numbers_may_come_as_strings(path: str, tmp_path: Path) -> None:
    """`--set x=0.85` hands Helm the string "0.85": the same render as the number."""
    default = chart_values([])
    node: Any = default
    for key in path.split("."):
        node = node[key]
    as_string = tmp_path / "string.yaml"
    text = f"{node:g}" if isinstance(node, float) else str(node)  # as Go prints the number
    as_string.write_text(json.dumps(nested(path, text)))
    assert helm_template([as_string], [], "t", "llm") == helm_template([], [], "t", "llm")


def test_set_passes_a_decimal() -> None:
    text = helm_template([], ["model.gpuMemoryUtilization=0.85"], "t", "llm")
    assert '"0.85"' in text
