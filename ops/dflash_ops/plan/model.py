"""Typed inputs and outputs of the block-size planner."""

from __future__ import annotations

from math import lcm
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dflash_ops.vocabulary import MAX_K

KvCacheDtype = Literal["auto", "bfloat16", "fp8"]


def ring_capacity(compress_ratio: int, k: int) -> int:
    """QSA ring capacity R = r * ceil((r + k) / r) (QSAKeyStateCache.get_kv_cache_spec)."""
    return compress_ratio * -(-(compress_ratio + k) // compress_ratio)


def smallest_valid_block_size(minimum: int, alignment: int, ring: int) -> int:
    """Smallest block size >= minimum that both the kernel alignment and the ring divide."""
    step = lcm(alignment, ring)
    return step * -(-minimum // step)


class BlockSizeInputs(BaseModel):
    """One configuration the block size is computed for."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    tp: int = Field(ge=1)
    kv_cache_dtype: KvCacheDtype = "auto"
    k: int = Field(ge=0, le=MAX_K)


class BlockSizePlan(BaseModel):
    """The block-size terms for one configuration; all byte sizes are per rank."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    tp: int
    kv_cache_dtype: KvCacheDtype
    k: int
    attention_page_bytes_per_token: int = Field(description="A: K+V bytes per token per rank")
    gdn_state_bytes: int = Field(description="GDN conv + recurrent state per request per rank")
    ple_state_bytes: int = Field(description="PLE short-conv state per request (replicated)")
    mamba_page_bytes: int = Field(description="M: the largest Mamba state page")
    mamba_page_source: Literal["gdn", "ple"]
    kernel_alignment: int = Field(description="a: kernel block alignment on this GPU")
    automatic_block_size: int = Field(description="B: what unpatched vLLM 0.33.0 picks")
    ring_capacity: int = Field(description="R: QSA ring capacity for this k")
    automatic_is_valid: bool = Field(description="R divides B: unpatched vLLM starts")
    recommended_block_size: int = Field(description="smallest size >= B divisible by a and R")
    engine: Literal["vllm", "closed-form"]

    @classmethod
    def from_terms(
        cls,
        inputs: BlockSizeInputs,
        *,
        attention_page: int,
        gdn_state: int,
        ple_state: int,
        kernel_alignment: int,
        automatic_block_size: int,
        compress_ratio: int,
        engine: Literal["vllm", "closed-form"],
    ) -> BlockSizePlan:
        ring = ring_capacity(compress_ratio, inputs.k)
        return cls(
            gpu=inputs.gpu,
            tp=inputs.tp,
            kv_cache_dtype=inputs.kv_cache_dtype,
            k=inputs.k,
            attention_page_bytes_per_token=attention_page,
            gdn_state_bytes=gdn_state,
            ple_state_bytes=ple_state,
            mamba_page_bytes=max(gdn_state, ple_state),
            mamba_page_source="gdn" if gdn_state >= ple_state else "ple",
            kernel_alignment=kernel_alignment,
            automatic_block_size=automatic_block_size,
            ring_capacity=ring,
            automatic_is_valid=automatic_block_size % ring == 0,
            recommended_block_size=smallest_valid_block_size(
                automatic_block_size, kernel_alignment, ring
            ),
            engine=engine,
        )

    def comparable(self) -> dict[str, object]:
        """Every computed term, without the name of the engine that computed it."""
        return self.model_dump(exclude={"engine"})
