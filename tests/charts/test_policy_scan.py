"""A real policy scanner (checkov, in .venv-tools) over every profile's render.

Every failed check must be listed below, for the resources it names, with the one-line reason
the chart does not follow it. Anything else fails the test.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from dflash_ops.chart.helm import helm_template
from dflash_ops.paths import PROFILES_DIR

from tests.conftest import find_tool

TEST_PODS = r"Pod\.llm\.dflash-dflash-serve-test-.*"
ENGINE = r"(Deployment|Pod)\.llm\.dflash-dflash-serve(\..*)?$"
ROUTER = r"Deployment\.llm\.dflash-dflash-serve-router$"
# The Ray layout's wait target for `helm install --wait` (templates/wait-for-ready.yaml).
WAIT_JOB = r"Job\.llm\.dflash-dflash-serve-wait-for-ready$"
# check id -> (resources it may fail on, why)
ACCEPTED: dict[str, tuple[str, str]] = {
    "CKV_K8S_8": (TEST_PODS, "helm test pods run one request and exit: nothing to keep alive"),
    "CKV_K8S_9": (TEST_PODS, "helm test pods serve nothing: no readiness to report"),
    "CKV2_K8S_6": (TEST_PODS, "helm test pods only make outbound requests; no policy selects them"),
    "CKV_K8S_11": (
        f"({ENGINE}|{ROUTER})",
        "no CPU limit on the engine or the router: throttling stalls tokenization, NCCL and the "
        "routing of every request",
    ),
    "CKV_K8S_15": (
        f"({ENGINE}|{ROUTER}|{TEST_PODS}|{WAIT_JOB})",
        "IfNotPresent: the pinned multi-GB engine image must not be pulled on every restart",
    ),
    "CKV_K8S_22": (
        ENGINE,
        "vLLM's Triton/FlashInfer/torch.compile JIT caches write under the image; "
        "unverified without a GPU",
    ),
    "CKV_K8S_38": (
        ROUTER,
        "the router's service discovery watches pods with its token (a Role: pods get/list/watch)",
    ),
    "CKV_K8S_40": (
        f"({ENGINE}|{ROUTER}|{TEST_PODS}|{WAIT_JOB})",
        "uid 1000 is the images' own user; no host paths or host namespaces are used",
    ),
    "CKV_K8S_43": (
        f"({ENGINE}|{ROUTER}|{TEST_PODS}|{WAIT_JOB})",
        "default images are tags (ours built by `make images`, the door's the official nginx "
        "release); image.*.digest and door.image.digest pin them",
    ),
}


def test_checkov_finds_nothing_unexplained(tmp_path: Path) -> None:
    renders = tmp_path / "renders"
    renders.mkdir()
    for profile in sorted(PROFILES_DIR.glob("*.yaml")):
        (renders / profile.name).write_text(helm_template([profile], [], "dflash", "llm"))
    (renders / "network-policy.yaml").write_text(
        helm_template([], ["networkPolicy.enabled=true"], "dflash", "llm")
    )
    result = subprocess.run(
        [
            find_tool("checkov"),
            "-d",
            str(renders),
            "--framework",
            "kubernetes",
            "-o",
            "json",
            "--quiet",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    passed = sum(r["summary"]["passed"] for r in reports)
    assert passed > 100, result.stderr[-2000:]  # the scanner really ran its checks
    unexplained = []
    for report in reports:
        for failure in report["results"]["failed_checks"]:
            accepted = ACCEPTED.get(failure["check_id"])
            if accepted is None or not re.match(accepted[0], failure["resource"]):
                unexplained.append(
                    f"{failure['check_id']} {failure['check_name']}: {failure['resource']}"
                )
    assert not unexplained, "\n".join(sorted(set(unexplained)))
