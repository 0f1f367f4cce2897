"""A CPU model pair where speculation pays, built on the fly (no download, seeded).

On a GPU speculation pays because one target forward pass costs about the same for 1 and for
k+1 tokens while decoding is memory-bound, and the draft is far cheaper than the target. The
same holds on a CPU for a target large enough that reading its weights dominates a decode step:
this target is a Qwen3 of about 180M parameters in bfloat16. Its layers from `draft_layers` on
have their output projections (attention `o_proj`, MLP `down_proj`) scaled down, so the first
layers mostly decide the next token; the draft is those first layers with the same embeddings,
final norm and head (a real smaller model, served with vLLM's `draft_model` method), so it
predicts the target well and costs a small fraction of it.

Random weights leave the next-token distribution flat (at temperature 1 the target's mean
entropy was 4.2 nats, its top token 0.19 of the mass, over 1,112 tokens): sampled traffic would
behave as on no trained model. So the final norm (which only the head reads, and which target
and draft share) is scaled by `logit_scale`: every logit is multiplied by it, the greedy choice
is unchanged, and at the default 3 the target's mean entropy at temperature 1 is about 0.9 nats
with its top token carrying about 0.7 of the mass (`python -m dflash_ops.local.pair_profile`
measures it). A trained chat model's distribution on its own replies is peaked like that; this
is an assumption here (no trained model can be fetched on this machine to measure one).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pydantic import Field

from dflash_ops.local.tiny_model import TinyModelSpec, qwen3_config, random_qwen3


class PayingPairSpec(TinyModelSpec):
    """Shape of the pair (the tiny pair's fields, larger); the defaults were chosen by
    measurement on a 2-core machine (docs/local-stack.md)."""

    hidden_size: int = 1024
    intermediate_size: int = 2816
    num_hidden_layers: int = 16
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    draft_layers: int = Field(default=2, ge=1)
    deep_scale: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description="factor on o_proj and down_proj of every layer from draft_layers on",
    )
    logit_scale: float = Field(
        default=3.0,
        gt=0,
        le=100,
        description="factor on the final norm's weight, so on every logit of target and draft: "
        "a peak like a trained model's under sampling; the greedy choice is unchanged",
    )


def build_pair(target_dir: Path, draft_dir: Path, spec: PayingPairSpec) -> None:
    """The target in `target_dir`, its first `spec.draft_layers` layers as the draft in
    `draft_dir`; both with the same tokenizer, saved as bfloat16 safetensors."""
    import torch
    from safetensors.torch import save_file

    if spec.draft_layers >= spec.num_hidden_layers:
        raise ValueError(
            f"draft_layers {spec.draft_layers} must be below the target's "
            f"{spec.num_hidden_layers} layers"
        )
    model, tokenizer = random_qwen3(target_dir, spec, "bfloat16")
    with torch.no_grad():  # quieten the deep layers
        for index, layer in enumerate(model.model.layers):
            if index >= spec.draft_layers:
                layer.self_attn.o_proj.weight.mul_(spec.deep_scale)
                layer.mlp.down_proj.weight.mul_(spec.deep_scale)
        model.model.norm.weight.mul_(spec.logit_scale)
        for param in model.parameters():
            param.data = param.data.to(torch.bfloat16)
    model.save_pretrained(target_dir, safe_serialization=True)

    draft_dir.mkdir(parents=True, exist_ok=True)
    for item in target_dir.iterdir():
        if item.is_file() and item.suffix != ".safetensors" and item.name != "config.json":
            shutil.copy2(item, draft_dir / item.name)
    qwen3_config(spec, tokenizer, spec.draft_layers, "bfloat16").save_pretrained(draft_dir)
    kept = {
        name: tensor.contiguous()
        for name, tensor in model.state_dict().items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < spec.draft_layers
    }
    save_file(kept, str(draft_dir / "model.safetensors"), metadata={"format": "pt"})
    (draft_dir / "dflash_draft.json").write_text(spec_record(spec))


def spec_record(spec: PayingPairSpec) -> str:
    """What the pair in a directory was built from (dflash_draft.json): a pair built from
    another spec is built again."""
    return json.dumps({"layers_of_target": spec.draft_layers, "seed": spec.seed,
                       "spec": spec.model_dump(mode="json")}, sort_keys=True)  # fmt: skip


def pair_is_current(draft_dir: Path, spec: PayingPairSpec) -> bool:
    try:
        return (draft_dir / "dflash_draft.json").read_text() == spec_record(spec) and (
            draft_dir / "model.safetensors"
        ).is_file()
    except OSError:
        return False


def parameter_count(directory: Path) -> int:
    """Parameters stored in a model directory's safetensors."""
    from safetensors import safe_open

    total = 0
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                total += _numel(handle.get_slice(name).get_shape())
    return total


def _numel(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
