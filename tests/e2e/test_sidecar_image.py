"""The sidecar image (podman) beside the real CPU engine: ready once the engine serves, and its
/metrics carry the engine's real speculative-decoding figures."""

from __future__ import annotations

import urllib.request

import pytest
from dflash_ops.local import stack
from prometheus_client.parser import text_string_to_metric_families

from tests.docker.podman import eventually, get, run_sidecar
from tests.e2e.test_local_stack import traffic

pytestmark = pytest.mark.e2e


def acceptance_lengths(url: str) -> list[float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as reply:
        page = reply.read().decode()
    return [
        sample.value
        for family in text_string_to_metric_families(page)
        if family.name == "dflash_mean_acceptance_length"
        for sample in family.samples
    ]


def test_sidecar_container_is_ready_and_reads_the_real_engine(
    container: list[str], local_stack: stack.StackState
) -> None:
    engine = next(p.url for p in local_stack.processes if p.name == "engine")
    _, url = run_sidecar(container, "--served-model", stack.SERVED_MODEL, engine_url=engine)
    _, body = eventually(
        lambda: (r := get(f"{url}/readyz"))[0] == 200 and r, 120, "readiness beside the engine"
    )
    assert body["state"] == "serving", body
    traffic(engine)
    lengths = eventually(
        lambda: acceptance_lengths(url), 60, "acceptance figures in the container's /metrics"
    )
    k = local_stack.config.num_speculative_tokens
    assert all(1.0 <= value <= 1 + k for value in lengths), lengths
