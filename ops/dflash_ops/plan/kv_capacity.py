"""KV-cache capacity per rank as vLLM 0.33.0 plans it, and what it means for concurrency.

vLLM splits the layers into KV-cache groups that draw blocks of one size from one pool per rank:
the QSA attention group (main K/V and the compressed indexer keys), the QSA raw-key rings, the
Mamba groups (GDN and PLE states, padded to the attention page) and the draft's group. A request
of length L holds, per group, the blocks its spec needs: ceil(L / block) for attention, one ring
block, 2 + k Mamba blocks in align mode (plus a prefill-checkpoint block where GDN exports
them), and the window plus the tokens in flight for a sliding-window draft. vLLM logs
`num_blocks / blocks_per_request(max_model_len) * max_model_len` as "KV cache size: N tokens".

Two engines compute it: vLLM's own planning functions (`vllm_engine.kv_capacity`) and the
closed form of the same accounting (`kv_capacity_closed_form`); a test holds them equal.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from dflash_ops.errors import UserError
from dflash_ops.plan.checkpoint import HybridCheckpoint
from dflash_ops.plan.draft import DraftProfile
from dflash_ops.vocabulary import ChartMethod

GIB = 1024**3
DEFAULT_CONTEXT_LENGTHS = (8192, 32768, 65536)
# Memory the engine's profile run takes beyond the weights, per rank: activation peak, CUDA
# graphs, NCCL and allocator overhead (vLLM's "non-KV" memory).
DEFAULT_PROFILE_RESERVE_GIB = 4.0
# vLLM 0.33.0's default max_num_batched_tokens for the OpenAI server
# (EngineArgs.get_batch_defaults): A100 2048, H100/H200 8192, 160 GiB and more 16384.
SERVER_MAX_NUM_BATCHED_TOKENS = {"a100": 2048, "h100": 8192, "h200": 8192, "b200": 16384}

LayerKind = Literal[
    "attention", "compressed", "ring", "gdn", "ple", "draft_sliding", "draft_full",
    # GLM-5.3-Flash (glm5_next_capacity)
    "mla", "indexer", "tail", "kda",
]  # fmt: skip
GroupKind = Literal["attention", "ring", "mamba", "draft"]
GROUP_OF: dict[str, GroupKind] = {
    "attention": "attention",
    "compressed": "attention",
    "draft_full": "attention",
    "ring": "ring",
    "gdn": "mamba",
    "ple": "mamba",
    "draft_sliding": "draft",
    "mla": "attention",
    "indexer": "attention",
    "tail": "ring",
    "kda": "mamba",
}


class KvLayer(BaseModel):
    """One layer that owns KV-cache or state pages, on every rank."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: LayerKind


def layer_inventory(
    ckpt: HybridCheckpoint, method: ChartMethod, draft: DraftProfile | None
) -> list[KvLayer]:
    """The layers the engine reports KV specs for, in the model's order: each QSA layer's main
    K/V, raw-key ring and compressed keys; each GDN layer; the PLE conv state; the MTP module's
    QSA layer(s) or the DFlash draft's attention layers."""
    layers: list[KvLayer] = []
    attention = set(ckpt.attention_layer_ids)
    for i in range(ckpt.num_hidden_layers):
        prefix = f"model.layers.{i}"
        if i in attention:
            layers += [
                KvLayer(name=f"{prefix}.self_attn.attn", kind="attention"),
                KvLayer(name=f"{prefix}.self_attn.indexer.raw_key_cache", kind="ring"),
                KvLayer(name=f"{prefix}.self_attn.indexer.compressed_key_cache", kind="compressed"),
            ]
        else:
            layers.append(KvLayer(name=f"{prefix}.linear_attn", kind="gdn"))
        if i in ckpt.ple_layer_ids:
            layers.append(KvLayer(name=f"{prefix}.ple", kind="ple"))
    if method == "mtp":
        for j in range(ckpt.mtp_num_hidden_layers):
            prefix = f"mtp.layers.{j}"
            layers += [
                KvLayer(name=f"{prefix}.self_attn.attn", kind="attention"),
                KvLayer(name=f"{prefix}.self_attn.indexer.raw_key_cache", kind="ring"),
                KvLayer(name=f"{prefix}.self_attn.indexer.compressed_key_cache", kind="compressed"),
            ]
    elif method == "dflash" and draft is not None:
        layers += draft_layers(draft)
    return layers


def draft_layers(draft: DraftProfile) -> list[KvLayer]:
    """A DFlash draft's attention layers, after the target's."""
    return [
        KvLayer(
            name=f"draft.layers.{j}.self_attn.attn",
            kind="draft_sliding" if kind == "sliding" else "draft_full",
        )
        for j, kind in enumerate(draft.layer_kinds)
    ]


class CapacityInputs(BaseModel):
    """What the user knows about the deployment; all memory figures are per rank."""

    model_config = ConfigDict(frozen=True)

    gpu_memory_gib: float = Field(gt=0)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    target_weights_gib: float = Field(ge=0)
    draft_weights_gib: float = Field(ge=0)
    profile_reserve_gib: float = Field(ge=0)
    max_model_len: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=1)
    async_scheduling: bool = Field(
        description="vLLM's default: on, except for n-gram drafting on the V1 runner"
    )
    context_lengths: tuple[PositiveInt, ...] = Field(default=DEFAULT_CONTEXT_LENGTHS, min_length=1)

    @property
    def budget_gib(self) -> float:
        return (
            self.gpu_memory_gib * self.gpu_memory_utilization
            - self.target_weights_gib
            - self.draft_weights_gib
            - self.profile_reserve_gib
        )

    @property
    def budget_bytes(self) -> int:
        return int(self.budget_gib * GIB)

    @property
    def max_in_flight_tokens(self) -> int:
        # VllmConfig.max_in_flight_tokens: one batch per concurrent step (2 with async).
        return (2 if self.async_scheduling else 1) * self.max_num_batched_tokens

    def check_budget(self) -> None:
        if self.budget_bytes <= 0:
            raise UserError(
                f"no memory is left for the KV cache: {self.gpu_memory_gib:g} GiB x "
                f"--gpu-memory-utilization {self.gpu_memory_utilization:g} - weights "
                f"{self.target_weights_gib:.2f} GiB - draft {self.draft_weights_gib:.2f} GiB - "
                f"reserve {self.profile_reserve_gib:g} GiB = {self.budget_gib:.2f} GiB per rank; "
                "raise --tp or --gpu-memory-utilization, or lower the weights per rank"
            )


class KvCapacity(BaseModel):
    """vLLM's KV-cache plan for one k, and the concurrency it allows."""

    model_config = ConfigDict(frozen=True)

    k: int
    block_size: int
    kv_budget_gib_per_rank: float
    bytes_per_block: int = Field(description="one block id across its widest group, per rank")
    num_blocks: int = Field(description="blocks in the pool, the null block included")
    groups: dict[str, int] = Field(description="KV-cache groups by kind")
    blocks_per_request: dict[str, int] = Field(
        description="blocks one max_model_len request holds, by group kind"
    )
    kv_cache_tokens: int = Field(description='vLLM\'s logged "KV cache size: N tokens"')
    max_concurrency: float = Field(description="vLLM's logged maximum concurrency")
    requests_at: dict[int, int] = Field(
        description="requests of each context length up to max_model_len that fit at once "
        "(the null block excluded)"
    )
    mamba_state_bytes_per_request: int = Field(
        description="memory the Mamba blocks of one request hold, per rank"
    )
    start_error: str | None = Field(
        default=None, description="why vLLM would refuse to start with this max_model_len"
    )
    engine: Literal["vllm", "closed-form"]

    def comparable(self) -> dict[str, object]:
        return self.model_dump(exclude={"engine", "start_error"})


def requests_that_fit(num_blocks: int, blocks_per_request: int) -> int:
    """Whole requests the pool holds at once; the null block is never handed out."""
    return max(num_blocks - 1, 0) // blocks_per_request


def start_error(
    inputs: CapacityInputs, bytes_per_block: int, blocks_per_request: int, max_fit: int
) -> str | None:
    """vLLM's startup check (`_check_enough_kv_cache_memory`): one max_model_len request must
    fit in the budget less the null block."""
    needed = bytes_per_block * blocks_per_request
    available = inputs.budget_bytes - bytes_per_block
    if needed <= available:
        return None
    hint = f"--max-model-len {max_fit} fits" if max_fit > 0 else "not even one token fits"
    return (
        f"vLLM would not start: one {inputs.max_model_len:,}-token request needs "
        f"{needed / GIB:.2f} GiB of KV cache per rank, {available / GIB:.2f} GiB are left; "
        f"{hint}, or raise --gpu-memory-utilization"
    )
