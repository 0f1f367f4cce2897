"""Render a deployment plan as a table, JSON, or a Helm values snippet (stable formats)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Protocol, TypeVar

import yaml

from dflash_ops.errors import UserError
from dflash_ops.plan.gpus import gpu_profile
from dflash_ops.plan.kv_capacity import KvCapacity
from dflash_ops.plan.planner import CapacityAssumptions, DeploymentPlan
from dflash_ops.speculative_schedule import short_form
from dflash_ops.speculative_setting import SpeculativeSetting


def render_json(plan: DeploymentPlan) -> str:
    return json.dumps(plan.model_dump(mode="json"), indent=2) + "\n"


def render_helm_values(plan: DeploymentPlan) -> str:
    """Chart values for the planned deployment, for `helm install -f` or `dflash-serve render
    -f`: the GPU, TP, KV dtype, block size, prefix-match unit and speculative settings. A
    values file describes one deployment, so it needs one k."""
    only = one_plan(plan.plans)
    schedule = None if plan.schedule is None else tuple(plan.schedule)
    setting = SpeculativeSetting(only.k, plan.method, schedule)
    speculative = setting.chart_values(plan.draft_model)
    values = {
        "gpu": {"type": plan.gpu},
        "engine": engine_values(
            plan.tp, plan.kv_cache_dtype, only.recommended_block_size, plan.prefix_match_unit
        ),
        "speculative": speculative,
    }
    header = (
        f"# dflash-serve plan: {plan.gpu} TP{plan.tp} k={only.k} ({plan.engine} engine)\n"
        "# helm install RELEASE charts/dflash-serve -f THIS_FILE (or dflash-serve render -f)\n"
    )
    return header + yaml.safe_dump(values, sort_keys=False)


def one_plan(plans: Sequence[Planned]) -> Planned:
    """The plan of the one k a values file describes; one line when several were asked."""
    if len(plans) != 1:
        raise UserError(
            f"--format helm-values describes one deployment: pass one --k (got "
            f"{len(plans)}: {', '.join(str(p.k) for p in plans)})"
        )
    return plans[0]


def engine_values(tp: int, kv_cache_dtype: str, block: int, unit: int | None) -> dict[str, object]:
    """The chart's `engine` values for a planned deployment."""
    return {
        "tensorParallelSize": tp,
        # The chart names the model's own dtype "auto".
        "kvCacheDtype": "auto" if kv_cache_dtype == "bfloat16" else kv_cache_dtype,
        "blockSize": block,
        "prefixMatchUnit": unit,
    }


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
    header = ("k", "M bytes", "M from", "B auto", "R", "B starts?", "recommended")
    rows = [
        (
            str(p.k),
            str(p.mamba_page_bytes),
            p.mamba_page_source,
            str(p.automatic_block_size),
            str(p.ring_capacity),
            "yes" if p.automatic_is_valid else "NO",
            str(p.recommended_block_size),
        )
        for p in plan.plans
    ]
    out += columns(header, rows)
    if plan.prefix_match_unit:
        unit = plan.prefix_match_unit
        out.append(
            f"Prefix-cache hits land on multiples of {unit} tokens (--prefix-match-unit {unit}), "
            "not on whole blocks; with a DFlash2 draft this needs patch 0004."
        )
    else:
        out.append("Prefix-cache hits land on whole blocks (no --prefix-match-unit).")
    if plan.schedule is not None:
        out += [
            f"k schedule   {short_form(tuple(plan.schedule))} (running batch size: k); block size "
            f"and KV cache are sized for k={first.k}, its largest. On Model Runner V1 (mtp, "
            "ngram) vLLM then captures PIECEWISE CUDA graphs, not full ones; DFlash2 runs on V2.",
        ]
    out += ["", *render_capacity(plan), "", "vLLM arguments:"]
    for k, args in plan.vllm_args.items():
        label = f"  k={k}: " if len(plan.vllm_args) > 1 else "  "
        out.append(label + shlex.join(args))
    return "\n".join(out) + "\n"


def columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Right-aligned columns under a header and a dashed rule."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return lines


def _length(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else f"{tokens:,}"


class _HasK(Protocol):
    @property
    def k(self) -> int: ...


Planned = TypeVar("Planned", bound=_HasK)


class CapacityPlan(Protocol):
    """What the capacity table reads of a plan (either model's)."""

    @property
    def engine(self) -> str: ...
    @property
    def plans(self) -> Sequence[_HasK]: ...
    @property
    def capacity_assumptions(self) -> CapacityAssumptions: ...
    @property
    def capacity(self) -> dict[int, KvCapacity]: ...


def render_capacity(plan: CapacityPlan) -> list[str]:
    """The KV-cache plan per k, side by side: blocks, vLLM's logged figure, requests that fit."""
    a = plan.capacity_assumptions
    i = a.inputs
    first = plan.capacity[plan.plans[0].k]
    out = [
        f"KV cache per rank (vLLM 0.33.0 KV-cache planning, {plan.engine} engine)",
        f"  budget {first.kv_budget_gib_per_rank:g} GiB = {i.gpu_memory_gib:g} GiB x "
        f"{i.gpu_memory_utilization:g} - weights {i.target_weights_gib:.2f} - draft "
        f"{i.draft_weights_gib:.2f} - profile reserve {i.profile_reserve_gib:g}",
        f"    weights: {a.target_weights_source}; draft: {a.draft_weights_source}",
        f"  max_model_len {i.max_model_len:,}, max_num_batched_tokens "
        f"{i.max_num_batched_tokens:,}, async scheduling {'on' if i.async_scheduling else 'off'}",
    ]
    if a.draft is not None:
        window = f", window {a.draft.sliding_window}" if a.draft.sliding_window else ""
        out.append(
            f"  draft {a.draft.name}: {len(a.draft.layer_kinds)} KV layers "
            f"({', '.join(sorted(set(a.draft.layer_kinds)))}{window}), "
            f"{a.draft.num_key_value_heads} KV heads of {a.draft.head_dim}; {a.draft.source}"
        )
    lengths = list(i.context_lengths)
    header = (
        "k", "block", "blocks", "attn", "ring", "mamba", "draft", "per req",
        "KV tokens*", "vs first", *(f"reqs@{_length(n)}" for n in lengths),
    )  # fmt: skip
    rows = []
    for p in plan.plans:
        c = plan.capacity[p.k]
        b = c.blocks_per_request
        counts = [b["attention"], b["ring"], b["mamba"], b["draft"], sum(b.values())]
        ratio = c.kv_cache_tokens / first.kv_cache_tokens if first.kv_cache_tokens else 0.0
        rows.append(
            (
                str(c.k),
                str(c.block_size),
                f"{c.num_blocks:,}",
                *map(str, counts),
                f"{c.kv_cache_tokens:,}",
                f"{ratio:.3f}",
                *(f"{c.requests_at[n]:,}" if n in c.requests_at else "-" for n in lengths),
            )
        )
    out += columns(header, rows)
    out += [
        f"  attn/ring/mamba/draft: blocks one {i.max_model_len:,}-token request holds in each "
        "group (Mamba: 2 + k per group in align mode, 1 more where the GPU's prefill kernel "
        "exports checkpoints)",
        '* what vLLM logs as "KV cache size: N tokens": blocks / blocks per request x '
        "max_model_len. reqs@N: requests of N tokens that fit at once.",
    ]
    out += [f"  k={c.k}: {c.start_error}" for c in plan.capacity.values() if c.start_error]
    return out


def render(plan: DeploymentPlan, fmt: str) -> str:
    return {"table": render_table, "json": render_json, "helm-values": render_helm_values}[fmt](
        plan
    )
