from __future__ import annotations

from tests.charts.conftest import Manifests, container, one, render


def test_pvc_survives_uninstall(default: Manifests) -> None:
    pvc = one(default, "PersistentVolumeClaim")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert "storageClassName" not in pvc["spec"]  # the cluster default unless set
    claim = one(default, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "model-cache",
        "persistentVolumeClaim": {"claimName": pvc["metadata"]["name"]},
    } in claim


def test_existing_claim_is_used_not_created() -> None:
    manifests = render("modelCache.existingClaim=shared-weights")
    assert not [k for k in manifests if k[0] == "PersistentVolumeClaim"]
    volumes = one(manifests, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "model-cache",
        "persistentVolumeClaim": {"claimName": "shared-weights"},
    } in volumes


def test_a_shared_cache_gets_its_own_claim_name() -> None:
    # Access modes are immutable: single-node (RWO) -> Ray (RWX) must create a new claim.
    rwo = one(render(), "PersistentVolumeClaim")["metadata"]["name"]
    rwx = one(render("modelCache.accessModes={ReadWriteMany}"), "PersistentVolumeClaim")
    assert rwx["metadata"]["name"] == f"{rwo}-rwx" and rwx["spec"]["accessModes"] == [
        "ReadWriteMany"
    ]


def test_without_a_cache_the_caches_live_in_the_writable_tmp_volume() -> None:
    manifests = render("modelCache.enabled=false")
    assert not [k for k in manifests if k[0] == "PersistentVolumeClaim"]
    env = {e["name"]: e.get("value") for e in container(manifests, "vllm")["env"]}
    assert env["HF_HOME"] == "/tmp/huggingface" and env["VLLM_CACHE_ROOT"] == "/tmp/vllm-cache"


def test_storage_class_is_passed() -> None:
    pvc = one(render("modelCache.storageClass=fast-ssd"), "PersistentVolumeClaim")
    assert pvc["spec"]["storageClassName"] == "fast-ssd"
