"""How a target and its draft behave under sampling, measured with transformers (no engine):

    python -m dflash_ops.local.pair_profile [--models-dir .local-stack/models] [--temperature 1]

The target samples continuations of the fixed prompts at the temperature; at every position it
reports the target's next-token entropy (nats) and top-token probability, the greedy agreement of
draft and target (their argmax equal), and the acceptance of a draft token that exact
verification gives: for a greedy draft (vLLM's default `draft_sample_method`: the draft's argmax,
no draft probabilities), p_target(argmax p_draft); for a sampled draft, sum_x min(p_target(x),
p_draft(x)). An engine's measured acceptance far from the figure for its draft method points at
its verification, not at the draft.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from pydantic import BaseModel

from dflash_ops.errors import UserError


class PairProfile(BaseModel):
    temperature: float
    positions: int
    vocab_size: int
    mean_entropy_nats: float
    uniform_entropy_nats: float
    mean_top_probability: float
    greedy_agreement: float
    greedy_draft_acceptance: float
    sampled_draft_acceptance: float

    def describe(self) -> str:
        return (
            f"temperature {self.temperature:g}, {self.positions} positions: target entropy "
            f"{self.mean_entropy_nats:.2f} nats (uniform {self.uniform_entropy_nats:.2f}), top "
            f"token {self.mean_top_probability:.2f} of the mass; greedy agreement "
            f"{self.greedy_agreement:.2f}; exact verification accepts a draft token "
            f"{self.greedy_draft_acceptance:.2f} of the time from a greedy draft, "
            f"{self.sampled_draft_acceptance:.2f} from a sampled one"
        )


def profile(
    target_dir: Path, draft_dir: Path, temperature: float, prompts: int, tokens: int, seed: int = 0
) -> PairProfile:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_ops.bench.core.prompts import fixed_prompts

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32)
    target.train(False)  # inference mode (no dropout)
    draft.train(False)
    generator = torch.Generator().manual_seed(seed)
    entropy = top = agree = greedy_accept = sampled_accept = 0.0
    count = 0
    with torch.no_grad():
        for _, text in fixed_prompts()[:prompts]:
            ids = tokenizer(text, return_tensors="pt").input_ids
            for _ in range(tokens):
                target_logits = target(ids).logits[0, -1].float()
                draft_logits = draft(ids).logits[0, -1].float()
                p = torch.softmax(target_logits / max(temperature, 1e-6), -1)
                q = torch.softmax(draft_logits / max(temperature, 1e-6), -1)
                entropy += float(-(p * torch.log(p.clamp_min(1e-30))).sum())
                top += float(p.max())
                agree += float(target_logits.argmax() == draft_logits.argmax())
                greedy_accept += float(p[draft_logits.argmax()])
                sampled_accept += float(torch.minimum(p, q).sum())
                count += 1
                ids = torch.cat([ids, torch.multinomial(p, 1, generator=generator)[None]], 1)
    vocab = int(target.config.vocab_size)
    return PairProfile(
        temperature=temperature,
        positions=count,
        vocab_size=vocab,
        mean_entropy_nats=entropy / count,
        uniform_entropy_nats=math.log(vocab),
        mean_top_probability=top / count,
        greedy_agreement=agree / count,
        greedy_draft_acceptance=greedy_accept / count,
        sampled_draft_acceptance=sampled_accept / count,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_ops.local.pair_profile")
    parser.add_argument("--models-dir", type=Path, default=Path(".local-stack/models"))
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--format", choices=["text", "json"], default="text")
    args = parser.parse_args(argv)
    if not 0 < args.temperature <= 100 or not 1 <= args.prompts <= 10 or args.tokens < 1:
        parser.error("--temperature (0, 100], --prompts 1 to 10, --tokens at least 1")
    from dflash_ops.local.paying_model import PayingPairSpec, build_pair, pair_is_current

    target, draft = args.models_dir / "paying-target", args.models_dir / "paying-draft"
    if not pair_is_current(draft, PayingPairSpec()):
        print(f"building the paying pair in {args.models_dir}", flush=True)
        build_pair(target, draft, PayingPairSpec())
    try:
        found = profile(target, draft, args.temperature, args.prompts, args.tokens)
    except OSError as err:
        raise UserError(f"cannot load the pair in {args.models_dir}: {err}") from None
    print(found.model_dump_json(indent=2) if args.format == "json" else found.describe())
    return 0


if __name__ == "__main__":
    import sys

    try:
        sys.exit(main())
    except UserError as err:
        sys.exit(f"error: {err}")
