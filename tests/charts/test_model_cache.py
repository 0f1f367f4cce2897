from __future__ import annotations

from tests.charts.conftest import Manifests, one, render


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


def test_storage_class_is_passed() -> None:
    pvc = one(render("modelCache.storageClass=fast-ssd"), "PersistentVolumeClaim")
    assert pvc["spec"]["storageClassName"] == "fast-ssd"
