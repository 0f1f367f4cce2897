"""How the target samples the benchmark's requests: `vllm bench serve`'s sampling flags with its
meanings. A value left out is not sent, so the server's generation defaults apply (the model's
generation_config, else vLLM's: temperature 1); `--temperature 0` is greedy.

Speculative decoding's acceptance depends on the sampling: a draft that agrees with the target's
argmax is accepted far less often when the target samples at temperature 1. Every figure and
every recommendation records the sampling it was measured under (BenchSettings.sampling).
"""

from __future__ import annotations

import zlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Sampling(BaseModel):
    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    temperature: float | None = Field(
        default=None, ge=0, le=100, description="None: not sent (the server's default)"
    )
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, description="-1 or 0: off (vLLM's meaning)")
    min_p: float | None = Field(default=None, ge=0, le=1)
    ignore_eos: bool = Field(
        default=False, description="generate max_tokens whatever the model says (vLLM's flag)"
    )
    request_seeds: bool = Field(
        default=True,
        description="send each sampled request a seed derived from the run's --seed, so a run "
        "repeats where the engine honours seeds (none with temperature 0: greedy needs none)",
    )

    @classmethod
    def recorded_before_sampling(cls) -> Sampling:
        """What every run measured before the sampling was recorded: greedy, to max_tokens."""
        return cls(temperature=0.0, ignore_eos=True)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def body(self, seed: int | None) -> dict[str, Any]:
        """The request fields: those given, and the request's `seed` when it samples."""
        fields: dict[str, Any] = {
            name: value
            for name, value in (
                ("temperature", self.temperature),
                ("top_p", self.top_p),
                ("top_k", self.top_k),
                ("min_p", self.min_p),
            )
            if value is not None
        }
        if self.ignore_eos:
            fields["ignore_eos"] = True
        if seed is not None and self.request_seeds and not self.greedy:
            fields["seed"] = seed
        return fields

    def describe(self) -> str:
        """e.g. `temperature 0 (greedy)`, `temperature 1, top-p 0.95, seeded`,
        `the server's default sampling`."""
        if self.greedy:
            parts = ["temperature 0 (greedy)"]
        elif self.temperature is None:
            parts = ["the server's default temperature"]
        else:
            parts = [f"temperature {self.temperature:g}"]
        parts += [
            f"{name} {value:g}"
            for name, value in (("top-p", self.top_p), ("top-k", self.top_k), ("min-p", self.min_p))
            if value is not None
        ]
        if self.request_seeds and not self.greedy:
            parts.append("per-request seeds")
        parts.append("ignore-eos" if self.ignore_eos else "stops at EOS")
        return ", ".join(parts)


def request_seed(run_seed: int, index: int) -> int:
    """The seed of the `index`-th request of a pass whose seed is `run_seed` (a 31-bit value:
    vLLM takes any int, other servers a signed 32-bit one)."""
    return zlib.crc32(f"{run_seed}:{index}".encode()) & 0x7FFFFFFF
