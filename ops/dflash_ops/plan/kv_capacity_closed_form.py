"""The closed form of vLLM 0.33.0's KV-cache planning for Qwen4Exp, without importing vLLM.

It follows the path vLLM takes for this model family: every layer's page (the Mamba pages
padded to the attention page), the block-outermost packing of `_get_packed_kv_cache_groups`
(buckets of one cache type, split into groups by the repeating layer pattern, Mamba and ring
buckets split to fit the widest group), the pool's bytes per block (the widest group), and the
blocks per request of each group (`max_memory_usage_bytes / page_size_bytes`).
`tests/ops/plan/test_kv_capacity_engines_agree.py` holds it to vLLM's own functions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from math import lcm

from dflash_ops.plan import closed_form
from dflash_ops.plan.checkpoint import HybridCheckpoint
from dflash_ops.plan.draft import DraftProfile
from dflash_ops.plan.gpus import gpu_profile
from dflash_ops.plan.kv_capacity import (
    GIB,
    GROUP_OF,
    CapacityInputs,
    KvCapacity,
    KvLayer,
    layer_inventory,
    requests_that_fit,
    start_error,
)
from dflash_ops.plan.model import BlockSizePlan
from dflash_ops.vocabulary import ChartMethod

BF16 = 2
ROPE_AXES = 3  # QSAKeyStateCache: int64 MRoPE positions stored as 4 bf16 each, 3 axes
BF16_PER_INT64 = 4


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Page:
    """A layer's KV spec as far as grouping and sizing see it."""

    name: str
    kind: str
    uniform_key: tuple[object, ...]  # what UniformTypeKVCacheSpecs.is_uniform_type compares
    page_bytes: int
    blocks_at: Callable[[int], int]  # ceil(max_memory_usage_bytes / page) for a length
    # Bytes the stride between blocks must be a multiple of (`get_block_stride_alignment`).
    stride_alignment: int = 1


def _pages(
    ckpt: HybridCheckpoint,
    plan: BlockSizePlan,
    method: ChartMethod,
    draft: DraftProfile | None,
    inputs: CapacityInputs,
) -> list[Page]:
    block = plan.recommended_block_size
    ring = plan.ring_capacity
    kv_bytes = closed_form.DTYPE_BYTES[
        ckpt.dtype if plan.kv_cache_dtype == "auto" else plan.kv_cache_dtype
    ]
    attention_page = block * plan.attention_page_bytes_per_token
    compressed_page = (block // ckpt.indexer_compress_ratio) * ckpt.indexer_head_dim * BF16
    ring_head = ckpt.indexer_head_dim
    if ckpt.uses_mrope:
        ring_head = cdiv(ring_head, BF16_PER_INT64) * BF16_PER_INT64 + ROPE_AXES * BF16_PER_INT64
    ring_page = ring * ring_head * BF16
    checkpoint_blocks = 1 if gpu_profile(plan.gpu).prefill_checkpoint_alignment else 0
    mamba_blocks = 2 + plan.k + checkpoint_blocks

    def full(length: int) -> int:
        return cdiv(length, block)

    pages: list[Page] = []
    for layer in layer_inventory(ckpt, method, draft):
        if layer.kind == "attention":
            page = Page(layer.name, layer.kind, ("full", block), attention_page, full)
        elif layer.kind == "compressed":
            page = Page(layer.name, layer.kind, ("full", block), compressed_page, full)
        elif layer.kind == "ring":
            page = Page(layer.name, layer.kind, ("ring", ring), ring_page, lambda _: 1)
        elif layer.kind in ("gdn", "ple"):
            key = ("mamba", layer.kind == "ple", plan.k, checkpoint_blocks)
            page = Page(layer.name, layer.kind, key, attention_page, lambda _: mamba_blocks)
        else:
            assert draft is not None
            page = draft_page(layer, draft, plan.tp, block, kv_bytes, inputs)
        pages.append(page)
    return pages


def draft_page(
    layer: KvLayer,
    draft: DraftProfile,
    tp: int,
    block: int,
    kv_bytes: int,
    inputs: CapacityInputs,
) -> Page:
    """A DFlash draft layer's page: full attention over the context, or its window plus the
    tokens in flight (`SlidingWindowSpec.max_admission_blocks_per_request`)."""
    page_bytes = block * 2 * draft.num_kv_heads_per_rank(tp) * draft.head_dim * kv_bytes
    if layer.kind == "draft_full":
        return Page(layer.name, layer.kind, ("full", block), page_bytes, lambda n: cdiv(n, block))
    window = draft.sliding_window or 0

    def sliding(length: int) -> int:
        held = min(window - 1 + inputs.max_in_flight_tokens, length)
        return cdiv(held, block) + 1

    return Page(layer.name, layer.kind, ("window", window, block), page_bytes, sliding)


def _approximate_gcd(values: list[int], lower_bound: int) -> int:
    # kv_cache_planning._approximate_gcd: the chunk size with the least padding, ties larger.
    best, best_pad = lower_bound, None
    for d in range(max(1, lower_bound), max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best):
            best, best_pad = d, pad
    return best


def _groups(pages: list[Page]) -> list[list[Page]]:
    """`_get_packed_kv_cache_groups` for these specs."""
    buckets: list[list[Page]] = []
    for page in pages:
        for bucket in buckets:
            if bucket[0].uniform_key == page.uniform_key:
                bucket.append(page)
                break
        else:
            buckets.append([page])

    def by_page(bucket: list[Page]) -> dict[int, list[Page]]:
        sizes: dict[int, list[Page]] = {}
        for page in bucket:
            sizes.setdefault(page.page_bytes, []).append(page)
        return sizes

    shapes = [(bucket, by_page(bucket)) for bucket in buckets]

    def max_per_page(bucket: list[Page]) -> int:
        return Counter(p.page_bytes for p in bucket).most_common(1)[0][1]

    def balanced(sizes: dict[int, list[Page]]) -> bool:
        return len({len(v) for v in sizes.values()}) == 1

    floor = max(
        (max_per_page(b) for b, sizes in shapes if balanced(sizes) and len(sizes) > 1),
        default=0,
    )
    repeats = (
        _approximate_gcd([max_per_page(b) for b, sizes in shapes if balanced(sizes)], floor)
        if floor
        else None
    )

    def num_groups_for(bucket: list[Page], sizes: dict[int, list[Page]]) -> int:
        if balanced(sizes) and repeats is not None:
            return cdiv(max_per_page(bucket), repeats)
        return 1

    def is_state(bucket: list[Page]) -> bool:
        kind = bucket[0].uniform_key[0]
        return kind in ("mamba", "ring") or (repeats is None and kind == "window")

    def widest(sizes: dict[int, list[Page]], n: int) -> int:
        return sum(cdiv(len(v), n) * page for page, v in sizes.items())

    anchor = max(
        widest(sizes, len(b) if is_state(b) else num_groups_for(b, sizes)) for b, sizes in shapes
    )
    groups: list[list[Page]] = []
    for bucket, sizes in shapes:
        n = num_groups_for(bucket, sizes)
        if anchor and is_state(bucket):
            n = max(n, cdiv(len(bucket), max(anchor // bucket[0].page_bytes, 1)))
        if n == 1:
            groups.append(bucket)
            continue
        pattern = list(zip(*sizes.values(), strict=False))
        groups += [[p for repeat in pattern[i::n] for p in repeat] for i in range(n)]
    return groups


def kv_capacity(
    ckpt: HybridCheckpoint,
    plan: BlockSizePlan,
    *,
    method: ChartMethod,
    draft: DraftProfile | None,
    inputs: CapacityInputs,
) -> KvCapacity:
    inputs.check_budget()
    return capacity_of_pages(
        _pages(ckpt, plan, method, draft, inputs), plan.k, plan.recommended_block_size, inputs
    )


def capacity_of_pages(pages: list[Page], k: int, block: int, inputs: CapacityInputs) -> KvCapacity:
    """vLLM's grouping, pool and per-request accounting over these pages."""
    groups = _groups(pages)
    # `_get_kv_cache_bytes_per_block`: the widest group, rounded to every stride alignment.
    widest = max(sum(p.page_bytes for p in group) for group in groups)
    alignment = lcm(*(p.stride_alignment for p in pages))
    bytes_per_block = cdiv(widest, alignment) * alignment
    num_blocks = inputs.budget_bytes // bytes_per_block

    def per_request(length: int) -> dict[str, int]:
        blocks: dict[str, int] = {"attention": 0, "ring": 0, "mamba": 0, "draft": 0}
        for group in groups:
            blocks[GROUP_OF[group[0].kind]] += max(p.blocks_at(length) for p in group)
        return blocks

    blocks = per_request(inputs.max_model_len)
    total = sum(blocks.values())
    available = inputs.budget_bytes - bytes_per_block

    def fits(length: int) -> bool:
        return bytes_per_block * sum(per_request(length).values()) <= available

    max_fit = 0
    if fits(1):
        low, high = 1, inputs.max_model_len
        while low <= high:
            mid = (low + high) // 2
            if fits(mid):
                max_fit, low = mid, mid + 1
            else:
                high = mid - 1
    counts: dict[str, int] = {"attention": 0, "ring": 0, "mamba": 0, "draft": 0}
    for group in groups:
        counts[GROUP_OF[group[0].kind]] += 1
    concurrency = num_blocks / total
    return KvCapacity(
        k=k,
        block_size=block,
        kv_budget_gib_per_rank=round(inputs.budget_bytes / GIB, 2),
        bytes_per_block=bytes_per_block,
        num_blocks=num_blocks,
        groups=counts,
        blocks_per_request=blocks,
        kv_cache_tokens=int(concurrency * inputs.max_model_len),
        max_concurrency=concurrency,
        requests_at={
            length: requests_that_fit(num_blocks, sum(per_request(length).values()))
            for length in inputs.context_lengths
            if length <= inputs.max_model_len
        },
        mamba_state_bytes_per_request=blocks["mamba"] * bytes_per_block,
        start_error=start_error(inputs, bytes_per_block, total, max_fit),
        engine="closed-form",
    )
