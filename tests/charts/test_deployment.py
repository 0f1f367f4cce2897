from __future__ import annotations

import json

from tests.charts.conftest import Manifests, arg_after, container, one, render


def test_defaults_serve_dflash2_block8_on_a100_tp2(default: Manifests) -> None:
    vllm = container(default, "vllm")
    assert vllm["command"] == ["vllm", "serve"]
    args = vllm["args"]
    assert args[0] == "Qwen/Qwen3.8-Flash-Next-AWQ"
    assert arg_after(args, "--tensor-parallel-size") == "2"
    assert "--enable-expert-parallel" in args
    assert arg_after(args, "--mamba-cache-mode") == "align"
    assert arg_after(args, "--block-size") == "1680"
    assert arg_after(args, "--reasoning-parser") == "qwen3"
    assert (
        "--enable-auto-tool-choice" in args and arg_after(args, "--tool-call-parser") == "qwen3_xml"
    )
    spec = json.loads(arg_after(args, "--speculative-config"))
    assert spec == {
        "method": "dflash",
        "model": "incoai/Qwen3.8-Flash-Next-DFlash2",
        "num_speculative_tokens": 7,
    }
    # The PLE n-gram table offload is vLLM 0.33.0's EngramConfig.cpu_offload.
    assert json.loads(arg_after(args, "--engram-config")) == {"cpu_offload": True}
    off = container(render("model.pleCpuOffload=false"), "vllm")["args"]
    assert json.loads(arg_after(off, "--engram-config")) == {"cpu_offload": False}


def test_gpus_placement_and_tolerations(default: Manifests) -> None:
    pod = one(default, "Deployment")["spec"]["template"]["spec"]
    vllm = container(default, "vllm")
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert vllm["resources"]["requests"]["nvidia.com/gpu"] == 2
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expr = term["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert expr["key"] == "nvidia.com/gpu.product" and "NVIDIA-A100-SXM4-80GB" in expr["values"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]


def test_shm_only_when_tp_above_one(default: Manifests) -> None:
    volumes = {
        v["name"]: v for v in one(default, "Deployment")["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert any(m["mountPath"] == "/dev/shm" for m in container(default, "vllm")["volumeMounts"])
    tp1 = render("engine.tensorParallelSize=1")
    names = {v["name"] for v in one(tp1, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert "dshm" not in names


def test_probes_budget_a_cold_load_and_readiness_goes_through_the_sidecar(
    default: Manifests,
) -> None:
    vllm = container(default, "vllm")
    startup = vllm["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600
    assert vllm["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9100}
    assert vllm["livenessProbe"]["httpGet"] == {"path": "/livez/engine", "port": 9100}
    live = vllm["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 120  # room for a sidecar restart
    sidecar = container(default, "sidecar")
    assert arg_after(sidecar["args"], "--engine-url") == "http://127.0.0.1:8000"
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert env["DFLASH_SIDECAR_STARTUP_BUDGET"] == "3600"


def test_rollout_cannot_deadlock_on_a_full_gpu_node(default: Manifests) -> None:
    assert one(default, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    rolling = one(render("rollout.strategy=RollingUpdate"), "Deployment")["spec"]["strategy"]
    assert rolling["rollingUpdate"]["maxSurge"] == 0


def test_hf_token_comes_from_a_secret() -> None:
    manifests = render("model.hfTokenSecret.name=hf", "model.hfTokenSecret.key=tok")
    env = {e["name"]: e for e in container(manifests, "vllm")["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "tok"}


def test_non_root_and_dropped_capabilities(default: Manifests) -> None:
    pod = one(default, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    for name in ("vllm", "sidecar"):
        ctx = container(default, name)["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"]["drop"] == ["ALL"]
    env = {e["name"]: e.get("value") for e in container(default, "vllm")["env"]}
    assert env["HF_HOME"].startswith("/models") and env["HOME"] == "/tmp"
    assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"


def test_methods_render_their_speculative_config() -> None:
    mtp = container(render("speculative.method=mtp", "speculative.numSpeculativeTokens=3"), "vllm")
    assert json.loads(arg_after(mtp["args"], "--speculative-config")) == {
        "method": "mtp",
        "num_speculative_tokens": 3,
    }
    off = container(render("speculative.method=off"), "vllm")
    assert "--speculative-config" not in off["args"]
    ngram = container(
        render("speculative.method=ngram", "speculative.numSpeculativeTokens=4"), "vllm"
    )
    assert json.loads(arg_after(ngram["args"], "--speculative-config"))["method"] == "ngram"
