"""Brief item 4: the V2 runner's drafter input tolerates a missing MTP buffer (no patch)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm033


class _Target:
    def __init__(self, buffer: object) -> None:
        self._buffer = buffer

    def get_mtp_target_hidden_states(self) -> object:
        return self._buffer


def test_none_from_get_mtp_target_hidden_states_falls_back() -> None:
    import torch
    from vllm.v1.worker.gpu.spec_decode.utils import get_drafter_hidden_states

    hidden = torch.randn(3, 8)
    assert get_drafter_hidden_states(_Target(None), hidden) is hidden  # type: ignore[arg-type]
    assert get_drafter_hidden_states(torch.nn.Linear(1, 1), hidden) is hidden


def test_a_real_buffer_is_sliced_to_the_token_count() -> None:
    import torch
    from vllm.v1.worker.gpu.spec_decode.utils import get_drafter_hidden_states

    buffer = torch.randn(16, 32)
    out = get_drafter_hidden_states(_Target(buffer), torch.randn(5, 8))  # type: ignore[arg-type]
    assert out.shape == (5, 32) and torch.equal(out, buffer[:5])
