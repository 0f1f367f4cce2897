"""What each GPU product changes in vLLM 0.33.0's block-size alignment for Qwen4Exp."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# vLLM 0.33.0: the QSA attention backend (`Qwen4ExpQSAFlashAttentionBackend`) supports
# kernel block sizes `MultipleOf(16)` on every NVIDIA GPU.
QSA_KERNEL_BLOCK = 16
# vllm/v1/attention/backends/gdn_attn.py: FLASHINFER_GDN_CHECKPOINT_ALIGNMENT.
FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64


_HOPPER_REASON = (
    "SM90: GDN prefill runs FlashInfer, whose align-mode checkpoints land on "
    "64-token boundaries: alignment lcm(16, 64) = 64"
)


class GpuProfile(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    product_label: str
    memory_gib: int
    compute_capability: tuple[int, int]
    # Token alignment of the GDN prefill checkpoints in `--mamba-cache-mode align`: vLLM takes it
    # only when every Mamba layer exports one (the PLE short conv exports 1; GDN exports 64 only
    # where the FlashInfer GDN prefill kernel runs). None: no checkpoint alignment.
    prefill_checkpoint_alignment: int | None
    alignment_reason: str


GPUS: dict[str, GpuProfile] = {
    "a100": GpuProfile(
        name="a100",
        product_label="NVIDIA-A100-SXM4-80GB",
        memory_gib=80,
        compute_capability=(8, 0),
        prefill_checkpoint_alignment=None,
        alignment_reason=(
            "SM80: GDN prefill runs the Triton/FLA kernel, which exports no prefill "
            "checkpoints, so only the QSA kernel block (16) aligns the block size"
        ),
    ),
    "h100": GpuProfile(
        name="h100",
        product_label="NVIDIA-H100-80GB-HBM3",
        memory_gib=80,
        compute_capability=(9, 0),
        prefill_checkpoint_alignment=FLASHINFER_GDN_CHECKPOINT_ALIGNMENT,
        alignment_reason=_HOPPER_REASON,
    ),
    "h200": GpuProfile(
        name="h200",
        product_label="NVIDIA-H200",
        memory_gib=141,
        compute_capability=(9, 0),
        prefill_checkpoint_alignment=FLASHINFER_GDN_CHECKPOINT_ALIGNMENT,
        alignment_reason=_HOPPER_REASON,
    ),
    "b200": GpuProfile(
        name="b200",
        product_label="NVIDIA-B200",
        memory_gib=180,
        compute_capability=(10, 0),
        prefill_checkpoint_alignment=FLASHINFER_GDN_CHECKPOINT_ALIGNMENT,
        alignment_reason=(
            "SM100 with head_k_dim 128 and CUDA 13: GDN prefill runs FlashInfer, "
            "64-token checkpoints: alignment lcm(16, 64) = 64"
        ),
    ),
}


def gpu_profile(name: str) -> GpuProfile:
    from dflash_ops.errors import UserError

    try:
        return GPUS[name.lower()]
    except KeyError:
        raise UserError(f"unknown GPU {name!r}: choose one of {', '.join(GPUS)}") from None
