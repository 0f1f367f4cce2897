"""Object names as the API server judges them (apimachinery's validation rules), for release
names from the shortest to the longest Helm accepts and full names at the 63-character limit,
in every layout: a render the chart does not refuse must be accepted name by name."""

from __future__ import annotations

import re

import pytest

from tests.charts.conftest import RWX, render
from tests.charts.test_day2_contracts import refused

# k8s.io/apimachinery/pkg/util/validation: IsDNS1035Label, IsDNS1123Label, IsDNS1123Subdomain.
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Kinds whose names are DNS-1035 labels (Service; KubeRay's RayCluster, 53 at most) or
# DNS-1123 labels (Pod names end up as host names: the API server takes subdomains, but the
# helm test pods and ours keep to labels); everything else: DNS-1123 subdomains.
LABEL_KINDS = {"Service": (DNS1035_LABEL, 63), "RayCluster": (DNS1035_LABEL, 53)}

KEY = "auth.apiKeySecret.name=vllm-api-key"
LAYOUTS = {
    "deployment": [],
    "router-auth": [KEY, "router.enabled=true", "replicas=2", RWX],
    "ray-auth": ["distributed.enabled=true", RWX, KEY],
}
RELEASES = ["t", "a" * 53, "prod-7", "x" + "9" * 40]


def problems(manifests: dict[tuple[str, str], dict[str, object]]) -> list[str]:
    found = []
    for kind, name in manifests:
        rule, limit = LABEL_KINDS.get(kind, (DNS1123_SUBDOMAIN, 253))
        if not rule.match(name) or len(name) > limit:
            found.append(f"{kind} {name!r} ({len(name)} characters)")
    for (kind, name), doc in manifests.items():
        labels = doc.get("metadata", {}).get("labels", {})  # type: ignore[union-attr]
        for key, value in labels.items():
            if len(str(value)) > 63 or not LABEL_VALUE.match(str(value)):
                found.append(f"{kind} {name}: label {key}={value!r}")
    return found


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("release", RELEASES)
def test_every_name_the_chart_renders_is_one_the_api_server_accepts(
    layout: str, release: str
) -> None:
    """Either every name is valid, or the chart refuses the release naming the rule and fix."""
    from dflash_ops.errors import UserError

    try:
        manifests = render(*LAYOUTS[layout], release=release)
    except UserError as err:
        assert "fullnameOverride" in str(err) and "characters" in str(err), str(err)
        assert layout.startswith("ray") and len(release) > 53 - len("-dflash-serve")
        return
    assert not problems(manifests)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_full_names_at_the_limit_keep_every_object_apart(layout: str) -> None:
    sets = [*LAYOUTS[layout]]
    if layout.startswith("ray"):
        sets.append("fullnameOverride=" + "r" * 53)
    else:
        sets.append("fullnameOverride=" + "f" * 63)
    manifests = render(*sets)
    assert not problems(manifests)
    # Kind and name are the API server's key: two objects of one kind never share a name (a
    # dict of renders would have silently dropped one: count the documents instead).
    assert len(manifests) == len(render_documents(sets))


def render_documents(sets: list[str]) -> list[tuple[str, str]]:
    import yaml
    from dflash_ops.chart.helm import helm_template

    docs = [d for d in yaml.safe_load_all(helm_template([], sets, "t", "llm")) if d]
    return [(d["kind"], d["metadata"]["name"]) for d in docs]


@pytest.mark.parametrize("release", ["1dflash", "dflash.prod"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_names_the_api_server_refuses_are_refused_by_the_chart(layout: str, release: str) -> None:
    """A Service named after such a release would be refused at install, after the rest."""
    assert not DNS1035_LABEL.match(release)
    assert "DNS-1035" in refused(*LAYOUTS[layout], release=release)
