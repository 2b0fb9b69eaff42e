"""Prefill/decode transfers: quarantined pages and the tenant tag (scheduler process).

Installed by the tenant cache factory on a PD worker (``--disaggregation-mode
prefill|decode``). Two defenses, on top of the scrubber and the gate:

* **Quarantine** (:class:`~sglang_iso.cache.quarantine.PageQuarantine`). The
  allocator's release path is tapped (outermost: before the owner check and the scrubber see a page):
  a page some transfer may still read (prefill) or write (decode) is held back
  instead of freed, and freed - through the scrubber - only when the transfer
  succeeded, or failed and is known drained. A failed transfer not drained in
  ``SGLANG_ISO_PD_DRAIN_TIMEOUT_S`` (default 60 s) keeps its pages quarantined,
  counted and logged, until a drain is seen or an operator reclaims them
  (``POST /iso/pd/reclaim``). A cleared pool (flush, weight update) never hands
  out a fenced page either.

      prefill: send_kv_chunk -> fence | inflight Success -> release | failure/abort -> drain
      decode:  _send_kv_metadata -> fence | commit -> release | failed poll -> drain (prefill's ABORT_ACK)

* **Tenant tag** (:mod:`sglang_iso.identity.transfer_tag`). The prefill writes
  a MAC over its request's namespace and bootstrap room into the spare columns
  of the metadata row that already carries the room (``bootstrap_room[idx, 1:3]``);
  the decode checks it against its own request before the KV is committed. A
  mismatch aborts the request (its pages are released and scrubbed) and counts
  a violation.

Fault injection for tests plugs in at :data:`FAULTS` (a no-op here; the test-only plugin
``sglang_iso_testing.pd_faults`` replaces it, and the launcher refuses test plugins in production).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from sglang_iso import observability
from sglang_iso.cache.quarantine import PageQuarantine
from sglang_iso.identity.transfer_tag import TAG_WORDS, tag_matches, transfer_tag
from sglang_iso.integration import allocator_tap, runtime
from sglang_iso.integration.allocator_tap import Order

logger = logging.getLogger(__name__)

TAG_COLUMNS = slice(1, 1 + TAG_WORDS)  # NOTE: SGLang uses only column 0 of the 8-wide (64 B) room row


class FaultSeam:
    """Where a test plugin injects transport faults; every method here is the no-fault behaviour."""

    def prefill_namespace(self, namespace: str | None) -> str | None:
        """Prefill: the namespace a transfer is tagged with."""
        return namespace

    def after_fence(self, guard: PdGuard, endpoint: Any, key: str) -> None:
        """After a transfer's pages were fenced (decode: published; prefill: a chunk sent)."""

    def probe_override(self, key: str) -> Any:
        """A drain probe to use instead of the transport's for transfer ``key``, or None."""
        return None


FAULTS = FaultSeam()


class PdGuard:
    """The quarantine and tag check of one PD worker's KV pool. Scheduler thread only."""

    def __init__(self, allocator: Any, secret: bytes, mode: str, timeout_s: float) -> None:
        self.allocator = allocator
        self.page_size = int(allocator.page_size)
        self.secret = secret
        self.mode = mode  # "prefill" or "decode"
        self.quarantine = PageQuarantine(timeout_s)
        self.tag_violations = 0  # decode: transfers whose tag did not match the request's namespace
        self.tags_checked = 0
        self._drained_keys: set[str] = set()  # decode: failed transfers whose prefill acked the drain
        self._paged = allocator_tap.is_paged(allocator)

    def install(self) -> PdGuard:
        """Subscribe to the allocator's release and clear (:mod:`~sglang_iso.integration.allocator_tap`,
        outermost: a held page reaches neither the owner table nor the scrubber until it is let go)."""
        tap = allocator_tap.tap_of(self.allocator)
        tap.subscribe(allocator_tap.RELEASE, Order.QUARANTINE, self._release)
        tap.subscribe("clear", Order.QUARANTINE, self._clear)
        logger.info(
            "sglang-iso: PD %s transfer quarantine installed (drain timeout %.0fs)", self.mode, timeout_of(self)
        )
        return self

    # ------------------------------------------------------------------ tap layers
    def _release(self, below: Any, *args: Any) -> Any:
        if self._paged:
            kept = [_keep(self.quarantine, p, 1) for p in args]
            kept = [k for k in kept if k.numel()]
            return below(*kept) if kept else None
        if not args or not args[0].numel():
            return below(*args)
        return below(_keep(self.quarantine, args[0], self.page_size), *args[1:])

    def _clear(self, below: Any) -> None:
        below()
        fenced = self.quarantine.fenced_pages()
        if fenced:
            # NOTE: a cleared pool lists every page free again; a fenced one must stay out until let go.
            self.quarantine.hold_all_fenced()
            _drop_from_free_list(self.allocator, fenced, self.page_size)

    def _release_pages(self, pages: list[int]) -> None:
        """Free pages the quarantine let go, through the layers below it (owner table, scrubber)."""
        if not pages:
            return
        device = self.allocator.device
        ids = torch.tensor(pages, dtype=torch.int64, device=device)
        tap = allocator_tap.tap_of(self.allocator)
        if self._paged:
            tap.call_below(allocator_tap.RELEASE, Order.QUARANTINE, ids)
            return
        slots = (ids[:, None] * self.page_size + torch.arange(self.page_size, device=device)).flatten()
        tap.call_below(allocator_tap.RELEASE, Order.QUARANTINE, slots)

    # ------------------------------------------------------------------ events
    def fence(self, key: str, slots: Any, owner: str | None = None) -> None:
        pages = torch.as_tensor(slots).reshape(-1).to(torch.int64) // self.page_size
        self.quarantine.fence(key, (int(p) for p in torch.unique(pages) if int(p) > 0), owner)

    def succeeded(self, key: str) -> None:
        self._release_pages(self.quarantine.succeeded(key))

    def failed(self, key: str, probe: Any) -> None:
        self._release_pages(self.quarantine.failed(key, probe))

    def tick(self) -> None:
        before = self.quarantine.timed_out_transfers
        self._release_pages(self.quarantine.poll())
        timed_out = self.quarantine.timed_out_transfers - before
        m = observability.metrics()
        if m is not None:
            m["pd_quarantined_pages"].set(len(self.quarantine.fenced_pages()))
            if timed_out:
                m["pd_timed_out_transfers"].inc(timed_out)
        if timed_out:
            observability.audit("pd_transfer_timeout", count=timed_out, mode=self.mode)

    def reclaim(self) -> int:
        pages = self.quarantine.reclaim_timed_out()
        self._release_pages(pages)
        logger.warning("sglang-iso: reclaimed %d quarantined pages of timed-out transfers (scrubbed)", len(pages))
        return len(pages)

    def held_tokens(self) -> int:
        """KV slots held back from the allocator (counted as protected by the tenant cache)."""
        return self.quarantine.held_count() * self.page_size

    def note_drained(self, key: str) -> None:
        """Decode: the prefill acknowledged that it will not write ``key``'s pages again."""
        self._drained_keys.add(key)

    def drained_probe(self, key: str) -> Any:
        def probe() -> bool:
            if key in self._drained_keys:
                self._drained_keys.discard(key)
                return True
            return False

        return probe

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "drain_timeout_s": self.quarantine.drain_timeout_s,
            "tags_checked": self.tags_checked,
            "tag_violations": self.tag_violations,
            **self.quarantine.status(),
        }

    # ------------------------------------------------------------------ tags
    def write_tag(self, rooms: torch.Tensor, idx: int, namespace: str | None, room: int) -> None:
        rooms[idx, TAG_COLUMNS] = torch.tensor(transfer_tag(self.secret, namespace, room), dtype=rooms.dtype)

    def tag_ok(self, rooms: torch.Tensor, idx: int, namespace: str | None, room: int) -> bool:
        self.tags_checked += 1
        received = tuple(int(w) for w in rooms[idx, TAG_COLUMNS].tolist())
        return tag_matches(self.secret, namespace, room, received)


def timeout_of(guard: PdGuard) -> float:
    return guard.quarantine.drain_timeout_s


def transfer_key(req: Any) -> str:
    return f"{req.rid}@{req.bootstrap_room}"


def _keep(quarantine: PageQuarantine, ids: torch.Tensor, page_size: int) -> torch.Tensor:
    """The part of a free (page ids, or slots when ``page_size`` > 1 on a token allocator) not held back."""
    if not quarantine.fenced_pages():
        return ids
    pages = (ids.to(torch.int64) // page_size).tolist()
    free_now = set(quarantine.divert(sorted(set(pages))))
    mask = torch.tensor([p in free_now for p in pages], dtype=torch.bool, device=ids.device)
    return ids[mask]


def _drop_from_free_list(alloc: Any, pages: set[int], page_size: int) -> None:
    free = alloc.free_pages
    ids = torch.tensor(sorted(pages), dtype=free.dtype, device=free.device)
    units = (
        ids if hasattr(alloc, "_release_page_ids") else (ids[:, None] * page_size + torch.arange(page_size)).flatten()
    )
    alloc.free_pages = free[~torch.isin(free, units.to(free.device))]


def _namespace(req: Any) -> str | None:
    return getattr(req, "extra_key", None)


def _owner(req: Any) -> str | None:
    """The namespace owner (tenant or group) whose KV ``req``'s pages carry; None when its tag does not verify."""
    active = runtime.active()
    extra_key = _namespace(req)
    if active is None or not isinstance(extra_key, str):
        return None
    ns = active.cache.namespace_of_request(extra_key, None)
    namespace = active.cache.namespace_of(ns) if ns is not None else None
    return namespace.tenant if namespace is not None else None


# ---------------------------------------------------------------------- prefill hooks
def after_send_kv_chunk(_result: Any, _scheduler: Any, req: Any, *args: Any, **kwargs: Any) -> None:
    guard = runtime.pd_guard()
    if guard is None or req.bootstrap_room is None or req.kv.req_pool_idx is None:
        return
    sent = int(getattr(req, "start_send_idx", 0) or 0)
    if sent > 0:
        row = _scheduler.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :sent]
        guard.fence(transfer_key(req), row, _owner(req))
        FAULTS.after_fence(guard, req.disagg_kv_sender, transfer_key(req))


def after_prefill_inflight(done: Any, *_args: Any, **_kwargs: Any) -> None:
    guard = runtime.pd_guard()
    if guard is None:
        return
    for req in done or ():
        if guard.quarantine.in_flight(transfer_key(req)):
            guard.succeeded(transfer_key(req))
    guard.tick()


def before_prefill_failure(_scheduler: Any, req: Any, *args: Any, **kwargs: Any) -> None:
    guard = runtime.pd_guard()
    if guard is not None:
        guard.failed(transfer_key(req), _prefill_probe(req))


def before_prefill_abort(_scheduler: Any, req: Any, *args: Any, **kwargs: Any) -> None:
    guard = runtime.pd_guard()
    if guard is not None:
        guard.failed(transfer_key(req), _prefill_probe(req))


def _prefill_probe(req: Any) -> Any:
    """When the engine will not read the request's pages again; None when unknown (the pages time out)."""
    key = transfer_key(req)
    override = FAULTS.probe_override(key)
    if override is not None:
        return override
    sender = getattr(req, "disagg_kv_sender", None)
    if type(sender).__name__ == "FakeKVSender":
        return lambda: True  # NOTE: a fake sender moves nothing
    mgr = getattr(sender, "kv_mgr", None)
    if mgr is None or not hasattr(mgr, "_staging_outstanding"):
        return None
    room = req.bootstrap_room
    return lambda: prefill_room_idle(mgr, room)


def prefill_room_idle(mgr: Any, room: int) -> bool:
    """SGLang's own drain predicate (``CommonKVManager._maybe_ack_drained_abort``): the room is failed (or gone),
    so a chunk still queued is skipped unread, and no dequeued chunk is in flight (counted at dequeue)."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    failed = room not in mgr.request_status or mgr.check_status(room) == KVPoll.Failed
    return bool(failed and mgr._staging_outstanding.get(room, 0) <= 0)


def after_set_buf(_result: Any, buffers: Any, req: Any, *args: Any, **kwargs: Any) -> None:
    guard = runtime.pd_guard()
    if guard is None or guard.mode != "prefill" or req.bootstrap_room is None:
        return
    namespace = FAULTS.prefill_namespace(_namespace(req))
    guard.write_tag(buffers.bootstrap_room, req.metadata_buffer_index, namespace, int(req.bootstrap_room))


# ---------------------------------------------------------------------- decode hooks
def after_send_kv_metadata(_result: Any, queue: Any, decode_req: Any, kv_indices: Any, *args: Any, **kw: Any) -> None:
    guard = runtime.pd_guard()
    if guard is None or str(kw.get("destination", "")).lower().endswith("host"):
        return
    key = transfer_key(decode_req.req)
    guard.fence(key, kv_indices, _owner(decode_req.req))
    FAULTS.after_fence(guard, decode_req.kv_receiver, key)


def around_commit(original: Any, queue: Any, decode_req: Any, *args: Any, **kwargs: Any) -> Any:
    guard = runtime.pd_guard()
    if guard is None:
        return original(queue, decode_req, *args, **kwargs)
    req = decode_req.req
    key = transfer_key(req)
    try:
        if _must_check_tag(decode_req) and not guard.tag_ok(
            queue.metadata_buffers.bootstrap_room, decode_req.metadata_buffer_index, _namespace(req),
            int(req.bootstrap_room),
        ):  # fmt: skip
            _refuse_transfer(guard, decode_req)
            return None
        return original(queue, decode_req, *args, **kwargs)
    finally:
        guard.succeeded(key)  # NOTE: committed or refused, the engine has finished writing these pages


def _must_check_tag(decode_req: Any) -> bool:
    """Every real transfer; not SGLang's own fake ones (warmup and health checks: no KV moves, no prefill)."""
    return type(decode_req.kv_receiver).__name__ != "FakeKVReceiver"


def _refuse_transfer(guard: PdGuard, decode_req: Any) -> None:
    from http import HTTPStatus

    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    req = decode_req.req
    guard.tag_violations += 1
    logger.error(
        "sglang-iso: KV for request %s (room %s) carries another namespace's tag; aborted, pages scrubbed",
        req.rid, req.bootstrap_room,
    )  # fmt: skip
    m = observability.metrics()
    if m is not None:
        m["pd_tag_violations"].inc()
    observability.audit("isolation_violation", kind="pd_transfer_tag", rid=req.rid, count=1)
    req.finished_reason = FINISH_ABORT(
        "KV transfer refused: it belongs to another tenant", status_code=HTTPStatus.INTERNAL_SERVER_ERROR
    )
    decode_req.kv_receiver.clear()
    decode_req.kv_receiver = None


def before_decode_failure(_queue: Any, decode_req: Any, *args: Any, **kwargs: Any) -> None:
    guard = runtime.pd_guard()
    if guard is None:
        return
    key = transfer_key(decode_req.req)
    # NOTE: a fake receiver is written by nobody, so it is drained at once.
    fake = type(decode_req.kv_receiver).__name__ == "FakeKVReceiver"
    default = (lambda: True) if fake else guard.drained_probe(key)
    guard.failed(key, FAULTS.probe_override(key) or default)


def before_do_release(queue: Any, decode_req: Any, *args: Any, **kwargs: Any) -> None:
    """Read the prefill's drain ack before SGLang forgets it (``_do_release`` clears the tracker)."""
    guard = runtime.pd_guard()
    receiver = decode_req.kv_receiver
    if guard is None or receiver is None:
        return
    mgr: Any = getattr(receiver, "kv_mgr", None)
    infos = getattr(receiver, "bootstrap_infos", None) or ()
    try:
        drained = bool(receiver.abort_notified) and mgr.is_abort_release_safe(decode_req.req.bootstrap_room, len(infos))
    except Exception:  # NOTE: no drain evidence: the pages stay quarantined (fail closed)
        drained = False
    if drained:
        guard.note_drained(transfer_key(decode_req.req))


def after_pop_transferred(_result: Any, *_args: Any, **_kwargs: Any) -> None:
    guard = runtime.pd_guard()
    if guard is not None:
        guard.tick()
