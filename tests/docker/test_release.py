"""`make release` against a real registry: Debian's docker-registry (the reference registry
implementation) on loopback, a throw-away GPG key, the images `make test` built. Judged by the
consumers: helm renders the chart from oci://, skopeo pulls each image under the shipped policy
(its signature verified by containers/image, not by our code) and refuses an unsigned or re-tagged
one, and each SBOM is fetched from its image's digest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dflash_ops.chart.helm import helm_binary
from dflash_ops.loopback import free_port
from dflash_ops.paths import CHART_DIR

from tests.conftest import REPO_ROOT
from tests.docker.podman import CONTAINERS_CONF, TAG

VERSION = "0.0.1-test.1"
# The images the release test publishes: the ones `make test` builds (the CPU image is opt-in).
RELEASED = ("sidecar", "router", "engine")
# A distribution each image's SBOM must name.
EXPECTED_COMPONENT = {"sidecar": "fastapi", "router": "vllm-router", "engine": "vllm"}
TOOLS = {"skopeo": "skopeo", "docker-registry": "docker-registry", "gpg": "gpg"}


def env() -> dict[str, str]:
    return os.environ | {"CONTAINERS_CONF": str(CONTAINERS_CONF)}


def skopeo(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["skopeo", *args], capture_output=True, text=True, env=env(),
                          timeout=900)  # fmt: skip
    if check and done.returncode != 0:
        raise AssertionError(f"skopeo {' '.join(args)}: {done.stderr[-1500:]}")
    return done


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    missing = [name for name, command in TOOLS.items() if shutil.which(command) is None]
    if missing or not (REPO_ROOT / ".venv-sbom" / "bin" / "cyclonedx-py").exists():
        pytest.skip(f"needs {', '.join(missing) or 'cyclonedx-bom'}: make setup installs them")
    root = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "release-test"},
    }
    (root / "config.yml").write_text(yaml.safe_dump(config))
    log = (root / "registry.log").open("wb")
    process = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")],
                               stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((root / "registry.log").read_text()[-2000:]) from None
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
        shutil.rmtree(root / "data", ignore_errors=True)  # the pushed images: GBs


@pytest.fixture(scope="module")
def released(
    registry: str, images: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path, dict[str, Any]]]:
    """The release run once: the published references (its printed JSON) and its out dir."""
    work = tmp_path_factory.mktemp("release")
    gnupg = work / "gnupg"
    gnupg.mkdir(mode=0o700)
    keys = os.environ | {"GNUPGHOME": str(gnupg)}
    try:
        yield release(registry, work, keys)
    finally:
        # The signing started a gpg-agent for the throw-away keyring: nothing is left running
        # (the agent may outlive gpgconf's request by a moment; pkill makes sure).
        subprocess.run(["gpgconf", "--kill", "all"], env=keys, capture_output=True, check=False)
        subprocess.run(["pkill", "-f", f"gpg-agent --homedir {gnupg}"], capture_output=True,
                       check=False)  # fmt: skip


def release(registry: str, work: Path, keys: dict[str, str]) -> tuple[str, Path, dict[str, Any]]:
    """A throw-away key, then the release with it."""
    subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key",
                    "dflash-serve release test <release-test@dflash-serve.invalid>", "ed25519",
                    "sign", "1d"], env=keys, check=True, capture_output=True)  # fmt: skip
    listed = subprocess.run(["gpg", "--list-secret-keys", "--with-colons"], env=keys,
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    fingerprint = next(line.split(":")[9] for line in listed.splitlines() if line[:4] == "fpr:")
    out = work / "out"
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.release", "--registry", f"{registry}/dflash-serve",
         "--version", VERSION, "--sign-key", fingerprint, "--lookaside",
         f"file://{work / 'signatures'}", "--plain-http", "--images", ",".join(RELEASED),
         "--out", str(out)],
        capture_output=True, text=True, timeout=1800, env=keys | env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    published = json.loads(done.stdout)
    assert published == json.loads((out / "published.json").read_text())
    return f"{registry}/dflash-serve", out, published


def verified_pull(out: Path, reference: str, name: str) -> subprocess.CompletedProcess[str]:
    """A pull under the release's policy and registries.d, into a directory of its own: pulled
    into podman's store, the verified signatures would stay on the local image the build made
    (the same image), shared with every other test."""
    into = out / "pulled" / name
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    done = skopeo("copy", "--quiet", "--src-tls-verify=false", "--policy",
                  str(out / "policy.json"), "--registries.d", str(out / "registries.d"),
                  f"docker://{reference}", f"dir:{into}", check=False)  # fmt: skip
    shutil.rmtree(into)  # the verdict is all a test needs (the engine's layers are GBs)
    return done


def test_the_chart_from_the_registry_renders_what_the_checkout_renders(
    released: tuple[str, Path, dict[str, Any]],
) -> None:
    registry, _, published = released
    helm = helm_binary()
    pulled = subprocess.run(
        [helm, "template", "r", published["chart"]["reference"], "--version", VERSION,
         "--plain-http", "--namespace", "llm"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr[-1500:]
    sets = []
    for name, value in (("engine", "image.engine"), ("sidecar", "image.sidecar"),
                        ("router", "router.image")):  # fmt: skip
        repository, digest = published[name]["reference"].split("@")
        tag = published[name]["tag"].rsplit(":", 1)[1]
        sets += ["--set", f"{value}.repository={repository}", "--set-string",
                 f"{value}.tag={tag}", "--set-string", f"{value}.digest={digest}"]  # fmt: skip
    local = subprocess.run(
        [helm, "template", "r", str(CHART_DIR), "--namespace", "llm", *sets],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    checkout_version = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["version"]
    expected = local.stdout.replace(f"dflash-serve-{checkout_version}", f"dflash-serve-{VERSION}")
    assert pulled.stdout == expected
    # The rendered pods run the images by digest.
    assert f"{registry}/sidecar@{published['sidecar']['reference'].split('@')[1]}" in pulled.stdout


def test_each_image_pulls_verified_and_carries_its_provenance(
    released: tuple[str, Path, dict[str, Any]],
) -> None:
    _, out, published = released
    for name in RELEASED:
        reference = published[name]["reference"]
        done = verified_pull(out, reference, name)
        assert done.returncode == 0, (name, done.stderr[-1500:])
        labels = json.loads(skopeo("inspect", "--tls-verify=false", f"docker://{reference}")
                            .stdout)["Labels"]  # fmt: skip
        assert labels["org.opencontainers.image.licenses"] == "Apache-2.0", name
        assert labels["org.opencontainers.image.source"].startswith("https://"), name
        assert labels["org.opencontainers.image.revision"] not in ("", None), name
        if name != "router":  # the router's version is vllm-router's
            assert TAG in labels["org.opencontainers.image.version"], name


def test_an_unsigned_or_retagged_image_is_refused(
    released: tuple[str, Path, dict[str, Any]],
) -> None:
    registry, out, published = released
    # Re-tagged: the signed image under a tag its signature does not name.
    copy = ("copy", "--quiet", "--src-tls-verify=false", "--dest-tls-verify=false")
    skopeo(
        *copy, f"docker://{published['sidecar']['tag']}", f"docker://{registry}/sidecar:retagged"
    )
    retagged = verified_pull(out, f"{registry}/sidecar:retagged", "sidecar")
    assert retagged.returncode != 0 and "not accepted" in retagged.stderr, retagged.stderr
    # Unsigned: other content pushed where the sidecar goes, without a signature.
    skopeo(*copy, f"docker://{published['router']['tag']}", f"docker://{registry}/sidecar:unsigned")
    unsigned = verified_pull(out, f"{registry}/sidecar:unsigned", "sidecar")
    assert unsigned.returncode != 0 and "no signature exists" in unsigned.stderr, unsigned.stderr


def test_each_sbom_is_found_from_its_image_digest(
    released: tuple[str, Path, dict[str, Any]], tmp_path: Path
) -> None:
    _, _, published = released
    for name in RELEASED:
        repository, digest = published[name]["reference"].split("@")
        found = tmp_path / name
        sbom_tag = f"{repository}:{digest.replace(':', '-')}.sbom"
        skopeo("copy", "--quiet", "--src-tls-verify=false", f"docker://{sbom_tag}", f"dir:{found}")
        manifest = json.loads((found / "manifest.json").read_text())
        assert manifest["artifactType"] == "application/vnd.cyclonedx+json", manifest
        (layer,) = manifest["layers"]
        sbom = json.loads((found / layer["digest"].split(":")[1]).read_text())
        assert sbom["bomFormat"] == "CycloneDX", name
        names = {component["name"].lower() for component in sbom["components"]}
        assert EXPECTED_COMPONENT[name] in names, (name, sorted(names)[:20])


def test_the_workflow_runs_the_same_release_on_a_version_tag() -> None:
    workflow = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "release.yml").read_text())
    triggers = workflow.get("on") or workflow.get(True)  # YAML 1.1 reads `on` as true
    assert triggers["push"]["tags"] == ["v*"]
    steps = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    (release,) = [run for run in steps if "make release" in run]
    for parameter in ("REGISTRY=", "VERSION=", "SIGN_KEY=", "LOOKASIDE="):
        assert parameter in release, parameter
    assert "PLAIN_HTTP" not in release  # the project's registry speaks TLS
