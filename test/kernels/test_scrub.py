"""scrub_pages: listed pages become zero in every buffer, every other byte is unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_iso_kernels import HostScrubber, _scrub_triton, scrub_pages
from sglang_iso_kernels.scrub import _sorted_distinct
from test.kernels.conftest import SEEDS

HEADS, HEAD_DIM, LAYERS = 2, 4, 2


def _random_buffer(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """Random values with (almost surely) no all-zero bytes pattern per row, on ``device``."""
    if dtype == torch.uint8:
        data = torch.randint(1, 256, shape, generator=gen, dtype=torch.uint8)
    else:
        data = (torch.rand(shape, generator=gen, dtype=torch.float32) + 0.5).to(dtype)  # values in [0.5, 1.5)
    return data.to(device)


def _make_pool(gen: torch.Generator, num_pages: int, page_size: int, device) -> list[torch.Tensor]:
    """Per layer: fp16 K, bf16 V, fp32 extra buffer, uint8 per-head scales; slots = (num_pages + 1) pages
    like SGLang's ``size + page_size``, and one buffer with spare slots past the last page."""
    slots = num_pages * page_size
    buffers = []
    for _ in range(LAYERS):
        buffers.append(_random_buffer(gen, (slots, HEADS, HEAD_DIM), torch.float16, device))  # K
        buffers.append(_random_buffer(gen, (slots, HEADS, HEAD_DIM), torch.bfloat16, device))  # V
        buffers.append(_random_buffer(gen, (slots, HEADS, 3), torch.float32, device))
        buffers.append(_random_buffer(gen, (slots, HEADS), torch.uint8, device))  # scales: 2-byte rows
    buffers.append(_random_buffer(gen, (slots + 3, 1), torch.uint8, device))  # 1-byte rows, extra slots
    return buffers


@pytest.fixture(params=["flat", "rows"])
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a Triton test with each kernel layout (the threshold between them moved to force one)."""
    monkeypatch.setattr(_scrub_triton, "_ROWS_MIN_WORDS", 1 if request.param == "rows" else 1 << 62)
    return str(request.param)


def _as_bytes(buf: torch.Tensor) -> torch.Tensor:
    return buf.reshape(buf.shape[0], -1).view(torch.uint8)  # [num_slots, row_bytes]


def _assert_scrubbed(before: list[torch.Tensor], after: list[torch.Tensor], pages: list[int], page_size: int):
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        old_b, new_b = _as_bytes(old).cpu(), _as_bytes(new).cpu()
        listed = torch.zeros(old_b.shape[0], dtype=torch.bool)
        for p in pages:
            listed[p * page_size : (p + 1) * page_size] = True
        assert torch.all(new_b[listed] == 0), f"buffer {i}: a listed page still has nonzero bytes"
        assert torch.equal(new_b[~listed], old_b[~listed]), f"buffer {i}: a row outside the listed pages changed"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("page_size", [1, 16])
def test_scrub_random_pages(seed: int, page_size: int, use_triton: bool, device, layout: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    num_pages = 6
    buffers = _make_pool(gen, num_pages, page_size, device)
    before = [b.clone() for b in buffers]
    count = int(torch.randint(1, num_pages, (1,), generator=gen))
    pages = torch.randperm(num_pages, generator=gen)[:count].tolist()
    scrub_pages(buffers, torch.tensor(pages, dtype=torch.int64, device=device), page_size, use_triton=use_triton)
    _assert_scrubbed(before, buffers, pages, page_size)


@pytest.mark.parametrize("pages", [[], [5], [0, 5], [0, 1, 2, 3, 4, 5]], ids=["empty", "last", "first+last", "all"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_scrub_edge_pages(pages: list[int], page_size: int, use_triton: bool, device, layout: str) -> None:
    gen = torch.Generator().manual_seed(7)
    buffers = _make_pool(gen, 6, page_size, device)
    before = [b.clone() for b in buffers]
    scrub_pages(buffers, torch.tensor(pages, dtype=torch.int64, device=device), page_size, use_triton=use_triton)
    _assert_scrubbed(before, buffers, pages, page_size)


def test_scrub_duplicates_and_empty_buffer_list(use_triton: bool, device, layout: str) -> None:
    gen = torch.Generator().manual_seed(3)
    buffers = _make_pool(gen, 4, 2, device)
    before = [b.clone() for b in buffers]
    scrub_pages(buffers, torch.tensor([1, 1, 3], device=device), 2, use_triton=use_triton)
    _assert_scrubbed(before, buffers, [1, 3], 2)
    scrub_pages([], torch.tensor([1], device=device), 2, use_triton=use_triton)  # no-op


@pytest.mark.parametrize("seed", SEEDS)
def test_scrub_dsa_index_key_rows_by_page(seed: int, use_triton: bool, device, layout: str) -> None:
    """DSA's index-key cache: one uint8 row of 64 fp8 keys + fp32 scales per 64-token page (row p is page p),
    zeroed as pages of one row beside the MLA latent's 64-slot pages, as scrub-on-free calls it."""
    gen = torch.Generator().manual_seed(seed)
    num_pages, page_size = 6, 64
    latent = [_random_buffer(gen, (num_pages * page_size, 1, 80), torch.bfloat16, device) for _ in range(LAYERS)]
    index_rows = [_random_buffer(gen, (num_pages, page_size * 132), torch.uint8, device) for _ in range(LAYERS)]
    before_latent, before_rows = [b.clone() for b in latent], [b.clone() for b in index_rows]
    pages = torch.randperm(num_pages, generator=gen)[: int(torch.randint(1, num_pages, (1,), generator=gen))]
    ids = pages.to(torch.int64).to(device)
    scrub_pages(latent, ids, page_size, use_triton=use_triton)
    scrub_pages(index_rows, ids, 1, use_triton=use_triton)
    _assert_scrubbed(before_latent, latent, pages.tolist(), page_size)
    _assert_scrubbed(before_rows, index_rows, pages.tolist(), 1)


def test_scrub_misaligned_buffer_uses_bytes(use_triton: bool, device, layout: str) -> None:
    """A buffer whose base address is not 4-byte aligned must still scrub exactly its rows."""
    page_size, num_pages, row_bytes = 2, 4, 4
    backing = torch.randint(1, 256, (num_pages * page_size * row_bytes + 1,), dtype=torch.uint8).to(device)
    buf = backing[1:].view(num_pages * page_size, row_bytes)  # [slots, 4] uint8 at an odd address
    assert buf.data_ptr() % 4 != 0, f"{buf.data_ptr()=}"
    before_backing = backing.clone()
    scrub_pages([buf], torch.tensor([2], device=device), page_size, use_triton=use_triton)
    _assert_scrubbed([before_backing[1:].view_as(buf)], [buf], [2], page_size)
    assert backing[0] == before_backing[0], "byte before the buffer changed"


def test_triton_one_launch_per_row_group(monkeypatch: pytest.MonkeyPatch, device, layout: str) -> None:
    """All buffers with the same words per page share one launch, and the grid-stride loops cover more
    work than programs (grid and blocks shrunk to force striding over pages, buffers and words)."""
    from test.kernels.conftest import TRITON_RUNNABLE

    if not TRITON_RUNNABLE:
        pytest.skip("Triton cannot run here")
    monkeypatch.setattr(_scrub_triton, "_MAX_PROGRAMS", 2)
    monkeypatch.setattr(_scrub_triton, "_ROW_MAX_PROGRAMS", 4)  # rows: 2 x 2 programs
    monkeypatch.setattr(_scrub_triton, "_BLOCK", 16)
    monkeypatch.setattr(_scrub_triton, "_ROW_BLOCK_MAX", 2)  # rows: several blocks per page (4-byte rows: 4 words)
    monkeypatch.setattr(_scrub_triton, "_ROW_BUFFER_PROGRAMS", 2)
    launches: list[int] = []
    real = _scrub_triton.scrub_pages_triton

    def spy(buffers, page_ids, page_words, word_bytes):
        launches.append(len(buffers))
        real(buffers, page_ids, page_words, word_bytes)

    monkeypatch.setattr(_scrub_triton, "scrub_pages_triton", spy)
    gen = torch.Generator().manual_seed(11)
    page_size = 4
    buffers = _make_pool(gen, 5, page_size, device)
    before = [b.clone() for b in buffers]
    scrub_pages(buffers, torch.tensor([0, 2, 4], device=device), page_size, use_triton=True)
    _assert_scrubbed(before, buffers, [0, 2, 4], page_size)
    # fp16 K and bf16 V share 16-byte rows; fp32 (24 B), uint8 scales (2 B) and the 1-byte buffer differ.
    assert sorted(launches) == [1, LAYERS, LAYERS, 2 * LAYERS], f"{launches=}"


@pytest.mark.parametrize(
    ("make_args", "match"),
    [
        (lambda b: ([b], torch.tensor([1], dtype=torch.int32), 2), "page_ids"),
        (lambda b: ([b], torch.tensor([[1]]), 2), "page_ids"),
        (lambda b: ([b], torch.tensor([4]), 2), "page_ids"),
        (lambda b: ([b], torch.tensor([-1]), 2), "page_ids"),
        (lambda b: ([b], torch.tensor([1]), 0), "page_size"),
        (lambda b: ([b.transpose(0, 1)], torch.tensor([0]), 1), "buffers"),
    ],
)
def test_scrub_rejects_bad_arguments(make_args, match: str) -> None:
    buf = torch.ones(8, 3)  # 4 pages of 2 slots
    with pytest.raises(ValueError, match=match):
        scrub_pages(*make_args(buf))


def test_forcing_triton_on_plain_cpu_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="use_triton"):
        scrub_pages([torch.ones(4, 2)], torch.tensor([0]), 2, use_triton=True)


@pytest.mark.gpu
def test_scrub_gpu_large_pool_matches_torch(layout: str) -> None:
    gen = torch.Generator().manual_seed(5)
    page_size, num_pages = 16, 512
    buffers = [b.cuda() for b in _make_pool(gen, num_pages, page_size, "cpu")]
    twins = [b.clone() for b in buffers]
    pages = torch.randperm(num_pages, generator=gen)[:200].cuda()
    scrub_pages(buffers, pages, page_size, use_triton=True)
    scrub_pages(twins, pages, page_size, use_triton=False)
    for a, b in zip(buffers, twins, strict=True):
        assert torch.equal(_as_bytes(a), _as_bytes(b))


# ---------------------------------------------------------------------------------------------------------
# HostScrubber: the scheduler's route on the host, buffers viewed once


@settings(max_examples=150, deadline=None)
@given(
    page_size=st.sampled_from([1, 4]),
    pages=st.lists(st.integers(0, 23), max_size=30),
    runs=st.sampled_from([0, 1, HostScrubber.MAX_RUNS, 100]),
)
def test_host_scrubber_zeroes_what_scrub_pages_zeroes(page_size: int, pages: list[int], runs: int) -> None:
    """Any page list, as contiguous runs (slices) or not (fancy indexing, forced with ``MAX_RUNS`` 0): the bytes
    of the listed pages are zero and every other byte is unchanged, exactly as :func:`scrub_pages` leaves them."""
    gen = torch.Generator().manual_seed(len(pages) * 31 + runs)
    buffers = _make_pool(gen, 24, page_size, "cpu")
    expected = [b.clone() for b in buffers]
    before = [b.clone() for b in buffers]
    scrub_pages(expected, torch.tensor(pages, dtype=torch.int64), page_size, use_triton=False)
    host = HostScrubber(buffers, page_size)
    host.MAX_RUNS = runs  # type: ignore[misc]  # (an instance attribute shadows the class's)
    assert host.zero(np.array(pages, dtype=np.int64)) == len(set(pages))
    _assert_scrubbed(before, buffers, pages, page_size)
    assert all(torch.equal(a, b) for a, b in zip(buffers, expected, strict=True))


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(-3, 40), max_size=60), ordered=st.booleans())
def test_sorted_distinct_is_np_unique(ids: list[int], ordered: bool) -> None:
    """The page ids a host scrub zeroes, sorted and each once: exactly ``np.unique``'s answer, for ids in any order,
    with duplicates, already sorted (the usual hand-out: one freed node's run), one or none."""
    array = np.array(sorted(ids) if ordered else ids, dtype=np.int64)
    got = _sorted_distinct(array)
    assert got.dtype == np.int64 and np.array_equal(got, np.unique(array))


def test_host_scrubber_refuses_what_scrub_pages_refuses() -> None:
    buf = torch.ones(8, 3)  # 4 pages of 2 slots
    host = HostScrubber([buf], 2)
    for bad in (np.array([4]), np.array([-1]), np.array([1], dtype=np.int32), np.array([[1]])):
        with pytest.raises(ValueError, match=r"pages|page ids"):
            host.zero(bad)
    assert torch.all(buf == 1)  # nothing zeroed by a refused call
    assert host.zero(np.array([3, 3])) == 1  # positive control: the last page is in range, zeroed once
    assert torch.all(buf[6:] == 0) and torch.all(buf[:6] == 1)
    with pytest.raises(ValueError, match="buffers"):
        HostScrubber([buf.transpose(0, 1)], 1)  # not contiguous: refused when built, as scrub_pages refuses


def test_host_scrubber_follows_a_buffer_whose_storage_was_replaced() -> None:
    buf = torch.ones(6, 2)
    host = HostScrubber([buf], 1)
    host.zero(np.array([0], dtype=np.int64))
    assert torch.all(buf[0] == 0) and torch.all(buf[1:] == 1)
    buf.set_(torch.ones(6, 2))  # the pool's tensor now holds other memory
    host.zero(np.array([5], dtype=np.int64))
    assert torch.all(buf[5] == 0) and torch.all(buf[:5] == 1), "the old memory was zeroed, not the buffer's"
