"""Build a tiny Qwen3 target and a perturbed draft on the fly: no hub download.

The tokenizer is a byte-level BPE trained on text shipped in this repository; the weights are
random (seeded). The draft is the target plus Gaussian noise of `noise` x each weight's std, so
acceptance is partial and decays by position; noise 0 gives a draft identical to the target.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


class TinyModelSpec(BaseModel):
    """Shape of the tiny model; the defaults start on 2 CPU cores in about a minute."""

    model_config = ConfigDict(frozen=True)

    vocab_size: int = Field(default=2048, ge=300)
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64  # the CPU attention kernel rejects 16 (after /health answers)
    max_position_embeddings: int = 8192  # StackConfig.max_model_len's ceiling
    seed: int = 0


def corpus_text() -> str:
    """Training text for the tokenizer: the prompt set and corpus shipped with the package."""
    data = resources.files("dflash_ops.data")
    parts = [data.joinpath("tiny_corpus.txt").read_text()]
    parts.append(data.joinpath("bench_prompts.json").read_text())
    return "\n".join(parts)


def train_tokenizer(directory: Path, vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_text().splitlines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(directory)
    return fast


def qwen3_config(spec: TinyModelSpec, tokenizer: Any, layers: int, dtype: str) -> Any:
    """A Qwen3 causal-LM config of `spec`'s shape with `layers` layers, for `tokenizer`."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        tie_word_embeddings=False,
        dtype=dtype,
    )


def random_qwen3(directory: Path, spec: TinyModelSpec, dtype: str) -> tuple[Any, Any]:
    """The tokenizer (saved in `directory`) and a seeded, randomly initialized Qwen3 causal LM
    of `spec`'s shape (not saved), its matrices widened x4: random init gives near-uniform
    logits, and greedy text would be one token repeated."""
    import torch
    from transformers import Qwen3ForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(directory, spec.vocab_size)
    torch.manual_seed(spec.seed)
    config = qwen3_config(spec, tokenizer, spec.num_hidden_layers, dtype)
    model = Qwen3ForCausalLM(config)  # type: ignore[no-untyped-call]
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(4.0 if param.ndim > 1 else 1.0)
    return model, tokenizer


def build_target(directory: Path, spec: TinyModelSpec) -> None:
    """Tokenizer plus a randomly initialized Qwen3 causal LM in `directory`."""
    model, _ = random_qwen3(directory, spec, "float32")
    model.save_pretrained(directory, safe_serialization=True)


def build_draft(target: Path, directory: Path, noise: float, seed: int = 1) -> None:
    """Copy `target` with Gaussian noise of `noise` x each weight's std added to every matrix."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    if noise < 0:
        raise ValueError(f"draft noise {noise} must be >= 0")
    directory.mkdir(parents=True, exist_ok=True)
    for item in target.iterdir():
        if item.name != "model.safetensors":
            shutil.copy2(item, directory / item.name)
    weights = load_file(str(target / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    perturbed = {}
    for name, tensor in weights.items():
        if tensor.ndim > 1 and noise > 0:
            scale = noise * float(tensor.float().std())
            noise_tensor = torch.randn(tensor.shape, generator=generator) * scale
            tensor = (tensor.float() + noise_tensor).to(tensor.dtype)
        perturbed[name] = tensor.contiguous()
    save_file(perturbed, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "dflash_draft.json").write_text(json.dumps({"noise": noise, "seed": seed}))
