"""Unit cases for patch 0004 against vLLM 0.33.0's own KV-cache classes, in the style of vLLM's
`tests/v1/core/test_single_type_kv_cache_manager.py` and
`tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py`.

They need a vLLM tree on the path (`PYTHONPATH=<tree>:<repo>`), so they run in the probe server
(`vllm_probe kv-cases NAME...`): each case is a function that raises AssertionError when the
tree does not behave as the patched series should. `tests/patches/test_kv_cache_cases.py` runs
them against the patched tree, and where a case names the old behaviour, against 0.33.0 too.

Layout of most cases: block 8, hash unit 4 (or 2), sliding window 10, so a hit at h needs the
blocks from (h - 9) // 8 up to the block holding h.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

CASES: dict[str, Callable[[], Any]] = {}


def case(function: Callable[[], Any]) -> Callable[[], Any]:
    CASES[function.__name__] = function
    return function


def _request(request_id: str, tokens: list[int], hash_block_size: int) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    return Request(
        request_id,
        tokens,
        SamplingParams(max_tokens=1),
        None,
        block_hasher=get_request_block_hasher(hash_block_size, sha256),
    )


def _sliding_spec(block_size: int = 8, window: int = 10) -> Any:
    import torch
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    return SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=1,
        dtype=torch.float32,
        sliding_window=window,
    )


class Cache:
    """A BlockPool with one request's blocks cached by hand: full blocks and partial entries."""

    def __init__(self, tokens: int = 32, hash_block_size: int = 4, block_size: int = 8) -> None:
        from vllm.v1.core.block_pool import BlockPool

        self.hash_block_size = hash_block_size
        self.block_size = block_size
        self.pool = BlockPool(
            num_gpu_blocks=32, enable_caching=True, hash_block_size=hash_block_size
        )
        self.request = _request("writer", list(range(100, 100 + tokens)), hash_block_size)
        self.blocks = self.pool.get_new_blocks(tokens // block_size)

    def full(self, *indices: int) -> None:
        for i in indices:
            self.pool.cache_full_blocks(
                request=self.request,
                blocks=self.blocks,
                num_cached_blocks=i,
                num_full_blocks=i + 1,
                block_size=self.block_size,
                kv_cache_group_id=0,
            )

    def partial(self, num_tokens: int) -> None:
        self.pool.cache_partial_block(
            request=self.request,
            block=self.blocks[num_tokens // self.block_size],
            num_tokens=num_tokens,
            kv_cache_group_id=0,
            block_size=self.block_size,
        )

    def evict(self, index: int) -> None:
        assert self.pool._maybe_evict_cached_block(self.blocks[index])

    def find(
        self, max_length: int, *, alignment: int | None = None, eagle: bool = False
    ) -> tuple[list[int | None], int]:
        """The sliding-window finder for a reader that shares the writer's tokens: the block
        ids it returns (None for the null block) and the hit length."""
        from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

        reader = _request("reader", [*self.request.all_token_ids, 7, 7, 7, 7], self.hash_block_size)
        (blocks,), hit = SlidingWindowManager.find_longest_cache_hit(
            block_hashes=reader.block_hashes,
            max_length=max_length,
            kv_cache_group_ids=[0],
            block_pool=self.pool,
            kv_cache_spec=_sliding_spec(self.block_size),
            drop_eagle_block=eagle,
            alignment_tokens=alignment or self.hash_block_size,
        )
        return [None if b.is_null else b.block_id for b in blocks], hit

    def ids(self, *indices: int | None) -> list[int | None]:
        return [None if i is None else self.blocks[i].block_id for i in indices]


def _prompt_tail_cache(tail: int = 20, hash_block_size: int = 4) -> Cache:
    """Blocks 0 and 1 cached whole, block 2 holding an earlier prompt's tail entry at `tail`."""
    cache = Cache(hash_block_size=hash_block_size)
    cache.full(0, 1)
    cache.partial(tail)
    return cache


@case
def fine_hit_on_a_partial_prompt_tail() -> None:
    """A 20-token hit: the window (tokens 11..19) lies in blocks 1 and 2; block 2 holds the
    partial entry of an earlier prompt's tail at 20; block 0 is not needed."""
    cache = _prompt_tail_cache()
    assert cache.find(max_length=23) == (cache.ids(None, 1, 2), 20)


@case
def a_missing_window_block_shortens_the_hit() -> None:
    cache = _prompt_tail_cache()
    cache.evict(1)
    # 20 and 16 need block 1; 8 needs only block 0.
    assert cache.find(max_length=23) == (cache.ids(0), 8)


@case
def blocks_below_the_window_may_be_absent() -> None:
    cache = _prompt_tail_cache()
    cache.evict(0)
    assert cache.find(max_length=23) == (cache.ids(None, 1, 2), 20)


@case
def an_entry_past_max_length_serves_max_length() -> None:
    """The coordinator re-checks shorter candidates: the entry at 22 serves a hit at 20."""
    cache = _prompt_tail_cache(22, hash_block_size=2)
    assert cache.find(max_length=21) == (cache.ids(None, 1, 2), 20)


@case
def eagle_drops_one_hash_unit() -> None:
    cache = _prompt_tail_cache()
    # EAGLE lookups get one unit of margin past the candidate, match 20 and drop to 16; the
    # blocks held are the window of the match (tokens 7..19): block 0 too.
    assert cache.find(max_length=24, eagle=True) == (cache.ids(0, 1), 16)


@case
def block_aligned_lookups_ignore_partial_entries() -> None:
    cache = Cache()
    cache.full(0, 1, 2)
    cache.partial(28)
    # Alignment 8: the original finder, two contiguous blocks for a window of 10.
    blocks, hit = cache.find(max_length=31, alignment=8)
    assert hit == 24 and blocks[-2:] == cache.ids(1, 2), (blocks, hit)


@case
def lookups_need_alignment_equal_to_the_hash_unit() -> None:
    """Hash unit 2, alignment 4: the fine indices would name the wrong blocks."""
    cache = Cache(hash_block_size=2)
    cache.full(0, 1)
    try:
        cache.find(max_length=15, alignment=4)
    except AssertionError:
        return
    raise AssertionError("a lookup at alignment 4 over hash unit 2 was answered")


def _manager(cls_name: str, pool: Any, alignment: int) -> Any:
    import torch
    from vllm.v1.core import single_type_kv_cache_manager as managers
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = (
        _sliding_spec()
        if cls_name == "SlidingWindowManager"
        else FullAttentionSpec(block_size=8, num_kv_heads=1, head_size=1, dtype=torch.float32)
    )
    manager = getattr(managers, cls_name)(
        spec, block_pool=pool, enable_caching=True, kv_cache_group_id=0, scheduler_block_size=8
    )
    manager.cache_hit_alignment_tokens = alignment
    return manager


@case
def a_copy_source_cached_this_step_defers_the_request() -> None:
    """A partial hit whose tail block got its entry in this step waits one step; in the next
    step the same hit is admitted (full attention and sliding window alike)."""
    for cls_name in ("FullAttentionManager", "SlidingWindowManager"):
        cache = Cache()
        cache.full(0, 1)
        cache.pool.new_step_starts()
        cache.partial(20)  # this step: the writer computes tokens 16..19 now
        manager = _manager(cls_name, cache.pool, alignment=4)
        first = cache.blocks[0] if cls_name == "FullAttentionManager" else cache.pool.null_block

        def blocks_to_allocate(
            hit: int, manager: Any = manager, first: Any = first, cache: Cache = cache
        ) -> int:
            return int(
                manager.get_num_blocks_to_allocate(
                    request_id="reader",
                    num_tokens=28,
                    new_computed_blocks=[first, *cache.blocks[1 : -(-hit // 8)]],
                    total_computed_tokens=hit,
                    num_local_computed_tokens=hit,
                    num_tokens_main_model=28,
                )
            )

        assert blocks_to_allocate(20) > cache.pool.num_gpu_blocks, cls_name
        cache.pool.new_step_starts()
        assert blocks_to_allocate(20) <= 3, cls_name
        # A hit on the block edge copies nothing and is never deferred.
        cache.partial(24)
        assert blocks_to_allocate(16) <= 3, cls_name


def _register_prompt_tail(alignment: int) -> bool:
    """Whether a sliding-window manager registers a 22-token prompt's tail (hash unit 4)."""
    cache = Cache(tokens=24)
    manager = _manager("SlidingWindowManager", cache.pool, alignment)
    request = _request("prompt", list(range(22)), 4)
    manager.req_to_blocks["prompt"] = list(cache.blocks[:3])
    manager.cache_blocks(request, 22, replay_boundaries=())
    tail = request.block_hashes[20 // 4 - 1]
    return cache.pool.get_cached_block(tail, [0]) is not None


@case
def prompt_tails_are_registered_only_for_fine_grained_hits() -> None:
    assert _register_prompt_tail(alignment=4)
    assert not _register_prompt_tail(alignment=8)


def _upstream_layout(**manager_options: Any) -> Any:
    """The layout of vLLM's test_hybrid_sliding_window_group_disables_partial_hash_hits: hash 2,
    full attention 2, an EAGLE sliding-window draft group of block 4 and window 4, Mamba 8."""
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )

    config = KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["full"],
                FullAttentionSpec(block_size=2, num_kv_heads=1, head_size=1, dtype=torch.float32),
            ),
            KVCacheGroupSpec(
                ["mamba"],
                MambaSpec(
                    block_size=8, shapes=(1, 1), dtypes=(torch.float32,), mamba_cache_mode="align"
                ),
            ),
            KVCacheGroupSpec(["swa_draft"], _sliding_spec(4, 4), is_eagle_group=True),
        ],
    )
    return KVCacheManager(
        config,
        max_model_len=8192,
        scheduler_block_size=8,
        hash_block_size=2,
        enable_caching=True,
        **manager_options,
    )


def _prefill_then_continue(chunks: tuple[int, ...]) -> tuple[Any, Any, int]:
    """In the upstream test's layout with EAGLE: a 12-token prompt prefilled in `chunks`, one
    step each, and freed; then the lookup of a request that continues it by two tokens."""
    manager = _upstream_layout(use_eagle=True)
    tokens = list(range(12))
    owner = _request("0", tokens, 2)
    blocks, computed, _ = manager.get_computed_blocks(owner)
    for chunk in chunks:
        assert manager.allocate_slots(owner, chunk, computed, blocks if computed else None)
        owner.num_computed_tokens += computed + chunk
        computed = 0
        manager.new_step_starts()
    manager.free(owner)
    manager.new_step_starts()
    blocks, computed, _ = manager.get_computed_blocks(_request("1", [*tokens, 12, 13], 2))
    return manager, blocks, computed


@case
def hybrid_sliding_window_group_keeps_partial_hash_hits() -> dict[str, Any]:
    """vLLM's `test_hybrid_sliding_window_group_disables_partial_hash_hits` as it reads after
    the patch: the same layout keeps fine-grained hits. The owner prefills as the scheduler
    splits it (the block edge 8, then the prompt's EAGLE-proof tail 10, then the rest); the
    continuing request hits the tail at 10 instead of the Mamba block edge 8."""
    manager, blocks, computed = _prefill_then_continue((8, 2, 2))
    result = {
        "partial_hits": manager.coordinator.enable_partial_hash_hits,
        "hit": computed,
        "blocks_per_group": [len(group) for group in blocks.blocks],
    }
    assert result["partial_hits"], result
    assert computed == 10, result
    assert len(blocks.blocks[0]) * 2 == computed, result  # full attention covers the hit
    return result


@case
def upstream_sliding_window_group_disables_partial_hash_hits() -> dict[str, Any]:
    """The upstream test's flow and expectation (prefill 8 + 4, hit at the Mamba block edge,
    partial hits off): true on 0.33.0, false with the patch."""
    manager, blocks, computed = _prefill_then_continue((8, 4))
    assert not manager.coordinator.enable_partial_hash_hits
    assert computed == 8 and len(blocks.blocks[0]) * 2 == computed
    return {"hit": computed}


@case
def mooncake_store_lookup_takes_fine_grained_sliding_window_hits() -> dict[str, Any]:
    """Mooncake's store coordinator mirrors the core lookup over an external pool with the
    managers' own finders: with the sliding-window finder fine-grained, a store holding the
    prefix up to a hash boundary inside a block serves it there, and the draft group loads
    only the blocks its window needs."""
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.coordinator import (
        ExternalCachedBlockPool,
        MooncakeStoreCoordinator,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MambaSpec

    groups = [
        KVCacheGroupSpec(
            ["full"],
            FullAttentionSpec(block_size=8, num_kv_heads=1, head_size=1, dtype=torch.float32),
        ),
        KVCacheGroupSpec(["swa_draft"], _sliding_spec(8, 10)),
        KVCacheGroupSpec(
            ["mamba"],
            MambaSpec(
                block_size=8, shapes=(1, 1), dtypes=(torch.float32,), mamba_cache_mode="align"
            ),
        ),
    ]
    coordinator = MooncakeStoreCoordinator(
        groups, scheduler_block_size=8, hash_block_size=4, enable_partial_hash_hits=True
    )
    request = _request("0", list(range(100, 128)), 4)
    hashes = request.block_hashes
    full = [hashes[1], hashes[3]]  # blocks 0 and 1 at block granularity
    tail = hashes[4]  # the prefix of 20 tokens
    exists = {(g, bytes(h)) for g in range(3) for h in [*full, tail]}
    masks, hit = coordinator.find_longest_cache_hit(
        hashes, 27, ExternalCachedBlockPool(4, exists), apply_eagle=False
    )
    result = {"hit": hit, "masks": [list(mask) for mask in masks]}
    assert hit == 20, result
    assert result["masks"][1] == [False, True, True], result  # the window: blocks 1 and 2
    return result


def run(names: list[str]) -> dict[str, dict[str, Any]]:
    """Each case's outcome: {"ok": True, "result": ...} or {"ok": False, "error": ...}."""
    import traceback

    outcomes: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            outcomes[name] = {"ok": True, "result": CASES[name]()}
        except Exception as err:  # a case reports what failed, whatever it is
            outcomes[name] = {
                "ok": False,
                "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc()[-2000:],
            }
    return outcomes
