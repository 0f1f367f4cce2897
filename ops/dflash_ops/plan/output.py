"""Render a deployment plan as a table, JSON, or a Helm values snippet (stable formats)."""

from __future__ import annotations

import json
import shlex

from dflash_ops.plan.gpus import gpu_profile
from dflash_ops.plan.planner import DeploymentPlan

FORMATS = ("table", "json", "helm-values")


def render_json(plan: DeploymentPlan) -> str:
    return json.dumps(plan.model_dump(mode="json"), indent=2) + "\n"


def render_helm_values(plan: DeploymentPlan) -> str:
    """Values the chart reads: `blockSizeTable.<gpu>.tp<N>."<k>"`, plus the chosen k/size when
    one k was planned. Paste under the chart's `engine:` key or pass with `-f`."""
    lines = [
        "# dflash-serve plan: recommended --block-size per num_speculative_tokens",
        f"# gpu={plan.gpu} tp={plan.tp} kvCacheDtype={plan.kv_cache_dtype} engine={plan.engine}",
        "blockSizeTable:",
        f"  {plan.gpu}:",
        f"    tp{plan.tp}:",
    ]
    lines += [f'      "{k}": {size}' for k, size in plan.recommended_block_size.items()]
    if len(plan.plans) == 1:
        only = plan.plans[0]
        lines += ["blockSize: " + str(only.recommended_block_size)]
        if plan.method != "off":
            lines += ["speculative:", f"  numSpeculativeTokens: {only.k}"]
    return "\n".join(lines) + "\n"


def render_table(plan: DeploymentPlan) -> str:
    gpu = gpu_profile(plan.gpu)
    first = plan.plans[0]
    out = [
        f"Checkpoint   {plan.checkpoint}",
        f"Target       {plan.gpu.upper()} x TP{plan.tp}, KV cache {plan.kv_cache_dtype}, "
        f"speculation {plan.method}, computed by the {plan.engine} engine",
        "",
        f"A  attention page per token per rank   {first.attention_page_bytes_per_token} B "
        "(2 x KV heads per rank x head_dim x KV dtype bytes)",
        "M  largest Mamba state page            see per-k rows (GDN conv+recurrent vs PLE "
        "short conv; k adds conv rows)",
        f"a  kernel alignment                    {first.kernel_alignment} ({gpu.alignment_reason})",
        "B  automatic block size (vLLM 0.33.0)  a * ceil(M / (a * A))",
        "R  QSA ring capacity                   r * ceil((r + k) / r), r = indexer_compress_ratio",
        "   a valid block size is >= B and divisible by both a and R",
        "",
    ]
    header = ("k", "M bytes", "M from", "B auto", "R", "B starts?", "recommended", "KV tokens*")
    rows = [
        (
            str(p.k),
            str(p.mamba_page_bytes),
            p.mamba_page_source,
            str(p.automatic_block_size),
            str(p.ring_capacity),
            "yes" if p.automatic_is_valid else "NO",
            str(p.recommended_block_size),
            f"{plan.kv_cache[p.k].kv_cache_tokens:,}",
        )
        for p in plan.plans
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    out.append("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    estimate = plan.kv_cache[first.k]
    out += [
        "",
        f"* KV tokens per rank: an estimate for {estimate.gpu_memory_gib:g} GiB at "
        f"utilization {estimate.gpu_memory_utilization:g}, weights "
        f"{estimate.weights_gib_per_rank:g} GiB + draft {estimate.draft_weights_gib_per_rank:g}"
        f" GiB + reserve {estimate.runtime_reserve_gib:g} GiB per rank; see --format json "
        "for what it leaves out.",
        "",
        "vLLM arguments:",
    ]
    for k, args in plan.vllm_args.items():
        label = f"  k={k}: " if len(plan.vllm_args) > 1 else "  "
        out.append(label + shlex.join(args))
    return "\n".join(out) + "\n"


def render(plan: DeploymentPlan, fmt: str) -> str:
    return {"table": render_table, "json": render_json, "helm-values": render_helm_values}[fmt](
        plan
    )
