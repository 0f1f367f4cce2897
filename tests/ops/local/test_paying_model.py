"""The paying pair's construction: a draft that is the target's first layers (a small spec here;
the real pair's acceptance and speed-up are measured on a real engine: tests/e2e and
`bench sweep --models paying`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dflash_ops.local.paying_model import PayingPairSpec, build_pair, parameter_count

SMALL = PayingPairSpec(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    draft_layers=1,
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    build_pair(root / "target", root / "draft", SMALL)
    return root / "target", root / "draft"


def test_the_draft_is_the_targets_first_layers_with_its_embeddings_norm_and_head(
    pair: tuple[Path, Path],
) -> None:
    from safetensors.torch import load_file

    target_dir, draft_dir = pair
    target = load_file(str(target_dir / "model.safetensors"))
    draft = load_file(str(draft_dir / "model.safetensors"))
    assert draft, "the draft holds no weights"
    for name, tensor in draft.items():
        assert name in target, name
        assert tensor.dtype == target[name].dtype and bool((tensor == target[name]).all()), name
    layers = {int(n.split(".")[2]) for n in draft if n.startswith("model.layers.")}
    assert layers == set(range(SMALL.draft_layers))
    shared = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    assert shared <= draft.keys()
    config = json.loads((draft_dir / "config.json").read_text())
    assert config["num_hidden_layers"] == SMALL.draft_layers
    assert json.loads((target_dir / "config.json").read_text())["dtype"] == "bfloat16"


def test_only_the_deep_layers_outputs_are_scaled_down(pair: tuple[Path, Path]) -> None:
    from safetensors.torch import load_file

    target = load_file(str(pair[0] / "model.safetensors"))

    def spread(layer: int, name: str) -> float:
        return float(target[f"model.layers.{layer}.{name}.weight"].float().std())

    for name in ("self_attn.o_proj", "mlp.down_proj"):
        first = spread(0, name)
        for layer in range(SMALL.draft_layers, SMALL.num_hidden_layers):
            assert spread(layer, name) < 0.2 * first, (layer, name)
    # The rest of a deep layer keeps its scale: it still costs what a layer costs to read.
    deep = SMALL.num_hidden_layers - 1
    assert spread(deep, "mlp.up_proj") > 0.5 * spread(0, "mlp.up_proj")


def test_both_models_share_one_tokenizer(pair: tuple[Path, Path]) -> None:
    target_dir, draft_dir = pair
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (target_dir / name).read_bytes() == (draft_dir / name).read_bytes(), name


def test_the_shipped_pair_has_a_draft_of_at_most_a_quarter_of_the_target() -> None:
    """On the meta device: the shapes of the real defaults, without building 180M weights."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    spec = PayingPairSpec()

    def parameters(layers: int) -> int:
        config = Qwen3Config(
            vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size, num_hidden_layers=layers,
            num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_key_value_heads, head_dim=spec.head_dim,
            tie_word_embeddings=False,
        )  # fmt: skip
        with torch.device("meta"):
            model = Qwen3ForCausalLM(config)  # type: ignore[no-untyped-call]
        return sum(p.numel() for p in model.parameters())

    target, draft = parameters(spec.num_hidden_layers), parameters(spec.draft_layers)
    assert 100e6 <= target <= 300e6, target
    assert draft <= target / 4, (draft, target)


def test_parameter_count_reads_the_saved_weights(pair: tuple[Path, Path]) -> None:
    from safetensors.torch import load_file

    target_dir, draft_dir = pair
    for directory in pair:
        weights = load_file(str(directory / "model.safetensors"))
        assert parameter_count(directory) == sum(t.numel() for t in weights.values())
    assert parameter_count(draft_dir) < parameter_count(target_dir)


def test_a_draft_as_deep_as_the_target_is_refused(tmp_path: Path) -> None:
    spec = SMALL.model_copy(update={"draft_layers": SMALL.num_hidden_layers})
    with pytest.raises(ValueError, match="draft_layers 4 must be below"):
        build_pair(tmp_path / "t", tmp_path / "d", spec)


def test_the_logit_scale_peaks_sampling_and_keeps_the_greedy_choice(tmp_path: Path) -> None:
    """The same seeded pair with and without the logit scale: every argmax is the same, the
    distribution at temperature 1 far more peaked; and a pair built from another spec is not
    taken for the current one."""
    import torch
    from dflash_ops.local.pair_profile import profile
    from dflash_ops.local.paying_model import pair_is_current
    from transformers import AutoModelForCausalLM

    flat = SMALL.model_copy(update={"logit_scale": 1.0})
    peaked = SMALL.model_copy(update={"logit_scale": 4.0})
    build_pair(tmp_path / "flat-target", tmp_path / "flat-draft", flat)
    build_pair(tmp_path / "peaked-target", tmp_path / "peaked-draft", peaked)
    assert pair_is_current(tmp_path / "peaked-draft", peaked)
    assert not pair_is_current(tmp_path / "flat-draft", peaked)
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        argmax = [
            AutoModelForCausalLM.from_pretrained(tmp_path / f"{name}-target", dtype=torch.float32)
            .eval()(ids)
            .logits[0]
            .argmax(-1)
            for name in ("flat", "peaked")
        ]
    assert bool((argmax[0] == argmax[1]).all())
    before = profile(tmp_path / "flat-target", tmp_path / "flat-draft", 1.0, 2, 8)
    after = profile(tmp_path / "peaked-target", tmp_path / "peaked-draft", 1.0, 2, 8)
    assert after.mean_entropy_nats < before.mean_entropy_nats - 0.5, (before, after)
    assert after.mean_top_probability > before.mean_top_probability
    assert 0 < after.greedy_draft_acceptance <= after.sampled_draft_acceptance <= 1
    assert after.positions == 16
