"""Patch 0001's capture semantics, on CPU, with the patched loop itself.

The nvidia/amd model files need GPU kernels and do not import here, so this test lifts
`Qwen4ExpModel.forward`, `_aux_hidden_state` and `Qwen4ExpDecoderLayer.forward` out of the
*patched* (and the original) source with `ast`, and runs them on a small stack of layers built
from vLLM's own torch hyper-connection modules
(`vllm.models.qwen4_exp.common.hyperconnection.GatedResidual`) around stand-in attention, MLP and
PLE blocks. The PP pack/collect helpers and slot layout are vLLM's `EagleModelMixin`.

Checked against an eager reference that materializes every layer's output:
- every captured feature (id L = the completed output of layer L - 1, mean over the HC streams),
  including id 0 and id == the layer count;
- without aux layers the output is a plain tensor, bit-identical to the unpatched loop, and
  capturing does not change the sampled stream;
- with pipeline parallelism, two ranks joined by IntermediateTensors give the same features.
"""

from __future__ import annotations

import ast
import itertools
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.vllm033

HIDDEN, HC, LAYERS, TOKENS = 16, 4, 6, 5
PLE_LAYER = 1  # its PLE adds to the multi-stream state: the capture comes before it
MODEL_FILES = {
    "nvidia": "vllm/models/qwen4_exp/nvidia/model.py",
    "amd": "vllm/models/qwen4_exp/amd/model.py",
}


def _methods(source: str, class_name: str = "Qwen4ExpModel") -> dict[str, ast.FunctionDef]:
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    return {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}


def _model_methods(source: str) -> dict[str, ast.FunctionDef]:
    return _methods(source)


class _PPGroup:
    def __init__(self, first: bool, last: bool) -> None:
        self.is_first_rank, self.is_last_rank = first, last


def _compile(functions: list[ast.FunctionDef], pp: _PPGroup) -> dict[str, Any]:
    """Functions lifted from a model file, compiled against CPU stand-ins for GPU-only names."""
    from vllm.sequence import IntermediateTensors

    module = ast.Module(body=functions, type_ignores=[])
    for func in module.body:
        func.decorator_list = []  # staticmethod is re-applied where it is bound
    namespace: dict[str, Any] = {
        "torch": torch,
        "nn": torch.nn,
        "islice": itertools.islice,
        "IntermediateTensors": IntermediateTensors,
        "get_pp_group": lambda: pp,
        "Qwen4ExpPLELayer": object,
        "Qwen4ExpSparseMoeBlock": object,
        "_QSA_LAYER_TYPES": ("qwen_sparse_attention", "indexed_attention"),
        "envs": types.SimpleNamespace(VLLM_MOE_SKIP_PADDING=False),
        "is_forward_context_available": lambda: False,
        "sp_all_gather": None,  # HC sequence parallelism is off in these runs
        "sp_reduce_scatter": None,
        "sp_shard": None,
        "sp_padding_mask": None,
    }
    exec(compile(module, "<lifted Qwen4Exp code>", "exec"), namespace)
    return {f.name: namespace[f.name] for f in functions}


def _compile_methods(source: str, pp: _PPGroup) -> dict[str, Any]:
    methods = _model_methods(source)
    wanted = [
        m for m in ("forward", "_aux_hidden_state", "_start_layer_ple_prefetch") if m in methods
    ]
    return _compile([methods[m] for m in wanted], pp)


class _HC:
    """vLLM's torch GatedResidual behind the delayed-combine API of the GPU modules.

    The injection a mix produces carries that mix's residuals; `combine` checks it is handed
    the same multi-stream state and applies vLLM's own GatedResidual.combine.
    """

    def __init__(self, gated: Any) -> None:
        self.gated = gated

    def mix(self, hidden: Any) -> tuple[Any, Any, Any]:
        block_input, residuals = self.gated.mix(hidden)
        return hidden, block_input, (self.gated, residuals)

    def combine(self, hidden: Any, block_output: Any, injection: Any) -> Any:
        gated, residuals = injection
        assert residuals[0] is hidden, "combine got a state its injection was not made from"
        return gated.combine(block_output, residuals)

    def combine_and_mix(
        self, hidden: Any, block_output: Any, injection: Any
    ) -> tuple[Any, Any, Any]:
        return self.mix(self.combine(hidden, block_output, injection))


class _PLE:
    """Stand-in PLE: adds a per-token term to every stream (needs its inputs, like PLE)."""

    def __init__(self) -> None:
        self.weight = torch.randn(HC * HIDDEN) * 0.3

    def start_prefetch(self, *args: Any) -> None:
        pass

    def __call__(self, hidden: Any, input_ids: Any, query_start_loc: Any, ngram: Any) -> Any:
        return hidden + torch.tanh(input_ids.float()).unsqueeze(-1) * self.weight


class _Layer(torch.nn.Module):  # type: ignore[misc]
    """A decoder layer whose forward is `Qwen4ExpDecoderLayer.forward` lifted from the
    source under test, around stand-in attention, MLP and PLE blocks."""

    def __init__(self, make_hc: Any, ple: bool) -> None:
        super().__init__()
        self.attn = torch.nn.Linear(HIDDEN, HIDDEN)
        self.mlp_block = torch.nn.Linear(HIDDEN, HIDDEN)
        self.attn_gated, self.mlp_gated = make_hc(), make_hc()
        self.attn_hyper_connection = _HC(self.attn_gated)
        self.mlp_hyper_connection = _HC(self.mlp_gated)
        self.ple = _PLE() if ple else None
        self.layer_type = "linear_attention"
        self.use_hc_sequence_parallel = self.use_sequence_parallel = False
        self.source_forward: Any = None

    def linear_attn(self, hidden_states: Any) -> Any:
        return torch.tanh(self.attn(hidden_states))

    def mlp(self, block_input: Any) -> Any:
        return torch.tanh(self.mlp_block(block_input))

    def forward(self, **kwargs: Any) -> Any:
        return self.source_forward(self, **kwargs)

    def eager(self, hidden: Any, input_ids: Any) -> Any:
        """The layer with every combine materialized at once: the reference."""
        if self.ple is not None:
            hidden = self.ple(hidden, input_ids, None, None)
        block_input, residuals = self.attn_gated.mix(hidden)
        hidden = self.attn_gated.combine(self.linear_attn(block_input), residuals)
        block_input, residuals = self.mlp_gated.mix(hidden)
        return self.mlp_gated.combine(self.mlp(block_input), residuals)


class _FinalMixer:
    def __init__(self, gated: Any) -> None:
        self.gated = gated

    def combine_and_mix(
        self, hidden: Any, block_output: Any, injection: Any
    ) -> tuple[Any, Any, Any]:
        gated, residuals = injection
        multi = gated.combine(block_output, residuals)
        sample, _ = self.gated.mix(multi)
        return multi, sample, None


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    from vllm.models.qwen4_exp.common.hyperconnection import GatedResidual, HyperConnectionConfig

    torch.manual_seed(0)
    config = HyperConnectionConfig(
        hc_count=HC,
        hidden_size=HIDDEN,
        params_dtype=torch.float32,
        hc_lowrank=8,
        hc_per_branch_norm=True,
    )

    def make_hc(use_combine: bool = True) -> Any:
        gated = GatedResidual(config, use_combine=use_combine)
        for param in gated.parameters():
            torch.nn.init.normal_(param, std=0.3)
        return gated

    layers = torch.nn.ModuleList(_Layer(make_hc, ple=i == PLE_LAYER) for i in range(LAYERS))
    embed = torch.nn.Embedding(32, HIDDEN)
    return {"layers": layers, "embed": embed, "final": _FinalMixer(make_hc(use_combine=False))}


def _model(
    stack: dict[str, Any], source: str, aux: tuple[int, ...], start: int, end: int, pp: _PPGroup
) -> Any:
    from vllm.model_executor.models.interfaces import EagleModelMixin

    methods = _compile_methods(source, pp)
    layer_forward = _compile([_methods(source, "Qwen4ExpDecoderLayer")["forward"]], pp)["forward"]
    for layer in stack["layers"]:
        layer.source_forward = layer_forward

    class Model(EagleModelMixin):
        pass

    model = Model()
    model.config = types.SimpleNamespace(hc_count=HC, hidden_size=HIDDEN)
    model.layers, model.start_layer, model.end_layer = stack["layers"], start, end
    model.use_hc_sequence_parallel = model.use_sequence_parallel = False
    model.hyper_connection_mixer = stack["final"]
    model._mtp_hidden_buffer = None
    model.embed_input_ids = stack["embed"]
    for name, func in methods.items():
        bound = (
            staticmethod(func).__get__(model)
            if name.startswith("_start")
            else types.MethodType(func, model)
        )
        setattr(model, name, bound)
    model.aux_hidden_state_layers = aux
    model._aux_slot_base_cached = model._aux_upstream_total_cached = 0
    return model


def _run(model: Any, input_ids: Any, intermediate: Any = None) -> Any:
    with torch.no_grad():
        return model.forward(
            input_ids,
            torch.arange(TOKENS),
            intermediate_tensors=intermediate,
            query_start_loc=torch.tensor([0, TOKENS]),
            ngram_context=torch.zeros(1),
        )


def _reference(stack: dict[str, Any], input_ids: Any) -> tuple[list[Any], Any]:
    """features[L] = mean over HC streams of the input of layer L; and the sampled stream."""
    with torch.no_grad():
        hidden = stack["embed"](input_ids).repeat(1, HC)
        features = [hidden.unflatten(-1, (HC, HIDDEN)).mean(dim=-2)]
        for layer in stack["layers"]:
            hidden = layer.eager(hidden, input_ids)
            features.append(hidden.unflatten(-1, (HC, HIDDEN)).mean(dim=-2))
        sample, _ = stack["final"].gated.mix(hidden)
    return features, sample


@pytest.fixture(scope="module")
def sources(patched_vllm: Path, wheel_sources: dict[str, bytes]) -> dict[str, dict[str, str]]:
    return {
        backend: {
            "patched": (patched_vllm / path).read_text(),
            "original": wheel_sources[path].decode(),
        }
        for backend, path in MODEL_FILES.items()
    }


INPUT_IDS = torch.tensor([3, 1, 4, 1, 5])


@pytest.mark.parametrize("backend", sorted(MODEL_FILES))
@pytest.mark.parametrize("aux", [(0, 2, LAYERS), (1, 3, 5), (LAYERS,), (2, 4)])
def test_captured_features_equal_the_materialized_outputs(
    stack: dict[str, Any], sources: dict[str, dict[str, str]], backend: str, aux: tuple[int, ...]
) -> None:
    model = _model(stack, sources[backend]["patched"], aux, 0, LAYERS, _PPGroup(True, True))
    sample, captured = _run(model, INPUT_IDS)
    features, reference_sample = _reference(stack, INPUT_IDS)
    assert len(captured) == len(aux)
    for layer_id, feature in zip(aux, captured, strict=True):
        assert feature.shape == (TOKENS, HIDDEN)
        torch.testing.assert_close(feature, features[layer_id], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sample, reference_sample, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", sorted(MODEL_FILES))
def test_features_are_not_a_neighbouring_layer_or_one_stream(
    stack: dict[str, Any], sources: dict[str, dict[str, str]], backend: str
) -> None:
    # The reference must tell the right feature from the likely mistakes, or the test above
    # would pass a wrong capture.
    model = _model(stack, sources[backend]["patched"], (3,), 0, LAYERS, _PPGroup(True, True))
    _, (feature,) = _run(model, INPUT_IDS)
    features, _ = _reference(stack, INPUT_IDS)
    for wrong in (features[2], features[4]):
        assert not torch.allclose(feature, wrong, atol=1e-3)
    with torch.no_grad():
        hidden = stack["embed"](INPUT_IDS).repeat(1, HC)
        for layer in list(stack["layers"])[:3]:
            hidden = layer.eager(hidden, INPUT_IDS)
    assert not torch.allclose(feature, hidden[:, :HIDDEN], atol=1e-3)  # stream 0 only


@pytest.mark.parametrize("backend", sorted(MODEL_FILES))
def test_no_aux_layers_is_bit_identical_to_the_unpatched_loop(
    stack: dict[str, Any], sources: dict[str, dict[str, str]], backend: str
) -> None:
    full = _PPGroup(True, True)
    original = _run(_model(stack, sources[backend]["original"], (), 0, LAYERS, full), INPUT_IDS)
    patched = _run(_model(stack, sources[backend]["patched"], (), 0, LAYERS, full), INPUT_IDS)
    assert isinstance(patched, torch.Tensor)
    assert torch.equal(patched, original)
    with_aux, _ = _run(
        _model(stack, sources[backend]["patched"], (1, 2, 5), 0, LAYERS, full), INPUT_IDS
    )
    assert torch.equal(with_aux, original)  # capture leaves the sampled stream untouched


def _pp_layout(monkeypatch: pytest.MonkeyPatch, model: Any, aux: tuple[int, ...]) -> None:
    """vLLM's own slot layout for a PP rank (EagleModelMixin._cache_aux_pp_layout)."""
    from vllm.distributed import parallel_state

    rank = types.SimpleNamespace(
        world_size=2, is_first_rank=model.start_layer == 0, is_last_rank=model.end_layer == LAYERS
    )
    monkeypatch.setattr(parallel_state, "model_parallel_is_initialized", lambda: True)
    monkeypatch.setattr(parallel_state, "get_pp_group", lambda: rank)
    model._set_aux_hidden_state_layers(aux)


@pytest.mark.parametrize("backend", sorted(MODEL_FILES))
@pytest.mark.parametrize("aux", [(1, 3, 4, LAYERS), (0, 3, 5), (3,), (4, 5)])
def test_pipeline_parallel_ranks_relay_features(
    stack: dict[str, Any],
    sources: dict[str, dict[str, str]],
    backend: str,
    aux: tuple[int, ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    split = 3
    source = sources[backend]["patched"]
    first = _model(stack, source, (), 0, split, _PPGroup(True, False))
    last = _model(stack, source, (), split, LAYERS, _PPGroup(False, True))
    _pp_layout(monkeypatch, first, aux)
    _pp_layout(monkeypatch, last, aux)
    intermediate = _run(first, INPUT_IDS)
    relayed = [i for i in aux if i <= split]
    assert sorted(intermediate.tensors) == sorted(
        ["hidden_states", *(f"aux_hidden_states_{i}" for i in range(len(relayed)))]
    )
    result = _run(last, INPUT_IDS, intermediate)
    features, reference_sample = _reference(stack, INPUT_IDS)
    sample, captured = result
    assert len(captured) == len(aux)  # id `split` is captured once, by the first rank
    for layer_id, feature in zip(aux, captured, strict=True):
        torch.testing.assert_close(feature, features[layer_id], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sample, reference_sample, rtol=1e-5, atol=1e-6)


def test_sync_check_both_backends_carry_the_same_capture_code(
    sources: dict[str, dict[str, str]],
) -> None:
    """A sync check between the two patched backends (not evidence of correctness: the
    semantic tests above are)."""
    dumps = {
        backend: textwrap.dedent(ast.unparse(_model_methods(s["patched"])["_aux_hidden_state"]))
        for backend, s in sources.items()
    }
    assert dumps["nvidia"] == dumps["amd"]
