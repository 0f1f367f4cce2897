"""The chart's `dflash-serve.speculativeConfig` helper renders exactly what the one Python
builder (dflash_ops.speculative_config) makes, for every method and k."""

from __future__ import annotations

import json

import pytest
from dflash_ops.chart.helm import engine_args_in_render, helm_template
from dflash_ops.chart.values import chart_values
from dflash_ops.speculative_config import speculative_config

CASES = [("dflash", k) for k in range(1, 16)] + [
    (method, k) for method in ("mtp", "ngram") for k in (1, 3, 15)
] + [("off", 7)]  # fmt: skip


@pytest.mark.parametrize(("method", "k"), CASES, ids=[f"{m}-k{k}" for m, k in CASES])
def test_chart_helper_matches_the_python_builder(method: str, k: int) -> None:
    draft = chart_values([])["speculative"]["draftModel"]
    sets = [f"speculative.method={method}", f"speculative.numSpeculativeTokens={k}"]
    args = engine_args_in_render(helm_template([], sets, "spec", "llm"))
    rendered = (
        json.loads(args[args.index("--speculative-config") + 1])
        if "--speculative-config" in args
        else None
    )
    assert rendered == speculative_config(method, k, draft if method == "dflash" else None)  # type: ignore[arg-type]
