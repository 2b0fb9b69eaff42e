"""The torch stand-ins for SGLang's Mamba2 state-space scan (prefill) and step (decode).

The oracle is SGLang's own chunked Triton scan (``mamba_chunk_scan_combined``) in the interpreter
(``TRITON_INTERPRET=1``, set by this folder's conftest), called in the form SGLang's mixer calls it (varlen
sequences, chunk indices and offsets from SGLang's own metadata helper). Two things keep it from running on CPU as
shipped, and the tests lift them for the oracle only: its wrapper enters ``torch.cpu.device`` (absent) and its
autotuner times configurations through a GPU driver (the first configuration is taken; each computes the same).
SGLang's decode kernel does not run in this Triton's interpreter ("mask has unsupported dtype"), so a decode step is
checked against the scan of a one-token sequence from the same state, which is the same step. Each scenario is
random per seed: ragged sequences longer and shorter than a chunk, with and without initial states, a padded line.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable

import pytest
import torch

from sglang_iso.platform import mamba2_cpu
from test.kernels.conftest import SEEDS, TRITON_RUNNABLE

pytestmark = pytest.mark.skipif(not TRITON_RUNNABLE, reason="Triton cannot run here")

HEADS, HEAD_DIM, GROUPS, STATE, LINES = 4, 8, 2, 16, 8
PAD = mamba2_cpu.PAD_SLOT_ID


@pytest.fixture
def triton_scan(monkeypatch: pytest.MonkeyPatch) -> Callable[..., torch.Tensor]:
    """SGLang's Triton scan in the interpreter: ``scan(x, dt, A, B, C, D, dt_bias, lens, initial, chunk, out)`` ->
    varlen states."""
    import triton.runtime.autotuner as autotuner
    from sglang.kernels.ops.mamba.triton_ops import mamba_chunk_scan_combined
    from sglang.srt.layers.attention.mamba.mamba2_metadata import Mamba2Metadata

    monkeypatch.setattr(torch.cpu, "device", lambda index=None: contextlib.nullcontext(), raising=False)
    monkeypatch.setattr(autotuner.Autotuner, "_bench", lambda self, *a, config=None, **k: [0.0, 0.0, 0.0])

    def scan(x, dt, A, B, C, D, dt_bias, lens, initial, chunk, out):  # type: ignore[no-untyped-def]
        cu = _offsets(lens)
        indices, offsets = Mamba2Metadata._query_start_loc_to_chunk_indices_offsets(cu, chunk, sum(lens))
        seq_idx = torch.repeat_interleave(torch.arange(len(lens), dtype=torch.int32), torch.tensor(lens))[None]
        return mamba_chunk_scan_combined(
            x, dt, A, B, C, chunk_size=chunk, D=D, z=None, dt_bias=dt_bias, seq_idx=seq_idx, chunk_indices=indices,
            chunk_offsets=offsets, cu_seqlens=cu, initial_states=initial, return_varlen_states=True,
            return_final_states=False, return_track_states=True, dt_softplus=True, dt_limit=(0.0, float("inf")),
            out=out, state_dtype=torch.float32,
        )[1]  # fmt: skip

    return scan


def _offsets(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)


def _inputs(gen: torch.Generator, tokens: int) -> dict[str, torch.Tensor]:
    return {
        "x": torch.randn(1, tokens, HEADS, HEAD_DIM, generator=gen),
        "dt": torch.randn(1, tokens, HEADS, generator=gen) * 0.5,
        "A": -torch.rand(HEADS, generator=gen) * 4,
        "B": torch.randn(1, tokens, GROUPS, STATE, generator=gen),
        "C": torch.randn(1, tokens, GROUPS, STATE, generator=gen),
        "D": torch.randn(HEADS, generator=gen),
        "dt_bias": torch.randn(HEADS, generator=gen) * 0.1,
    }


def _ours(inputs: dict[str, torch.Tensor], lens: list[int], initial: torch.Tensor | None, out: torch.Tensor):  # type: ignore[no-untyped-def]
    return mamba2_cpu.mamba_chunk_scan_combined_cpu(
        **inputs, chunk_size=8, z=None, cu_seqlens=_offsets(lens), initial_states=initial, return_varlen_states=True,
        return_track_states=True, dt_softplus=True, out=out, state_dtype=torch.float32,
    )  # fmt: skip


@pytest.mark.parametrize("chunk", [8, 64])
@pytest.mark.parametrize("with_initial", [True, False])
@pytest.mark.parametrize("seed", SEEDS)
def test_prefill_scan_matches_sglangs_triton_scan(
    triton_scan: Callable[..., torch.Tensor], seed: int, chunk: int, with_initial: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    lens = [5, 1, 19, 7, 12]  # shorter and longer than a chunk of 8
    inputs = _inputs(gen, sum(lens))
    initial = torch.randn(len(lens), HEADS, HEAD_DIM, STATE, generator=gen) if with_initial else None
    out_theirs, out_ours = torch.full_like(inputs["x"], float("nan")), torch.full_like(inputs["x"], float("nan"))
    want = triton_scan(**inputs, lens=lens, initial=initial, chunk=chunk, out=out_theirs)
    none, got, tracked = _ours(inputs, lens, initial, out_ours)
    assert none is None and tracked is None
    torch.testing.assert_close(out_ours, out_theirs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got.abs().max() > 0.1 and out_ours.abs().max() > 0.1  # the comparison is of values, not of zeros


@pytest.mark.parametrize("seed", SEEDS)
def test_decode_step_matches_the_triton_scan_of_one_token(triton_scan: Callable[..., torch.Tensor], seed: int) -> None:
    """``selective_state_update`` as the mixer calls it (per-head values repeated over the head dimension) against
    the scan of one-token sequences from the same states; the padded request's line is untouched."""
    gen = torch.Generator().manual_seed(seed)
    batch = 3
    inputs = _inputs(gen, batch)
    pool = torch.randn(LINES, HEADS, HEAD_DIM, STATE, generator=gen)
    lines = torch.tensor([5, PAD, 2], dtype=torch.int32)
    ours_pool, out = pool.clone(), torch.zeros(batch, HEADS, HEAD_DIM)
    mamba2_cpu.selective_state_update_cpu(
        ours_pool, inputs["x"][0], inputs["dt"][0][:, :, None].expand(-1, -1, HEAD_DIM),
        inputs["A"][:, None, None].expand(-1, HEAD_DIM, STATE), inputs["B"][0], inputs["C"][0],
        inputs["D"][:, None].expand(-1, HEAD_DIM), z=None, dt_bias=inputs["dt_bias"][:, None].expand(-1, HEAD_DIM),
        dt_softplus=True, state_batch_indices=lines, out=out,
    )  # fmt: skip
    served = [i for i, line in enumerate(lines.tolist()) if line != PAD]
    one = {k: (v[:, served] if v.dim() >= 3 else v) for k, v in inputs.items()}
    want_out = torch.zeros(1, len(served), HEADS, HEAD_DIM)
    want = triton_scan(**one, lens=[1] * len(served), initial=pool[lines[served].long()], chunk=8, out=want_out)
    torch.testing.assert_close(out[served], want_out[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours_pool[lines[served].long()], want, rtol=1e-4, atol=1e-4)
    assert torch.equal(out[1], torch.zeros(HEADS, HEAD_DIM))  # the padded request's output is left as it was
    untouched = [line for line in range(LINES) if line not in lines.tolist()]
    assert torch.equal(ours_pool[untouched], pool[untouched])
    assert not torch.equal(ours_pool[lines[served].long()], pool[lines[served].long()])  # the served lines moved


def test_forms_without_a_stand_in_name_themselves() -> None:
    gen = torch.Generator().manual_seed(0)
    inputs = _inputs(gen, 4)
    with pytest.raises(NotImplementedError, match="varlen form"):
        mamba2_cpu.mamba_chunk_scan_combined_cpu(**inputs, chunk_size=8, cu_seqlens=_offsets([4]))
    with pytest.raises(NotImplementedError, match="tracked"):
        mamba2_cpu.mamba_chunk_scan_combined_cpu(
            **inputs, chunk_size=8, cu_seqlens=_offsets([4]), return_varlen_states=True,
            track_seq_idx=torch.zeros(1, dtype=torch.int32), track_end_locs=torch.ones(1, dtype=torch.int32),
        )  # fmt: skip
    state = torch.zeros(LINES, HEADS, HEAD_DIM, STATE)
    x = torch.zeros(2, 2, HEADS, HEAD_DIM)  # two draft tokens per request: target verify
    with pytest.raises(NotImplementedError, match="target-verify"):
        mamba2_cpu.selective_state_update_cpu(state, x, x, state[0], x, x, disable_state_update=True)


def test_the_mixer_module_gets_every_name_it_leaves_unbound_on_cpu() -> None:
    """The names SGLang's Mamba2 mixer calls and binds only for CUDA, NPU and XPU: each bound by the shim (and
    ``mamba_chunk_scan_combined`` / ``selective_state_update``, which it imports for every device, replaced)."""
    import sglang.srt.layers.attention.mamba.mamba as mixer

    mamba2_cpu.apply()
    for name in (*mamba2_cpu.CONV_NAMES, *mamba2_cpu.UPDATE_NAMES):
        assert getattr(mixer, name).__module__ == "sglang_iso.platform.linear_attn_cpu", name
    assert mixer.mamba_chunk_scan_combined is mamba2_cpu.mamba_chunk_scan_combined_cpu
    assert mixer.selective_state_update is mamba2_cpu.selective_state_update_cpu
