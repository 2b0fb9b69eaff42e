"""SGLang symbols the prefill/decode transfer defenses use (merged into ``symbols.HOOKED_SYMBOLS``).

Plain ``(path, params, use)`` triples so this module imports nothing of ours.
"""

from __future__ import annotations

_PREFILL = "sglang.srt.disaggregation.prefill:SchedulerDisaggregationPrefillMixin"
_PREALLOC = "sglang.srt.disaggregation.decode:DecodePreallocQueue"
_TRANSFER = "sglang.srt.disaggregation.decode:DecodeTransferQueue"

PD_SYMBOLS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (f"{_PREFILL}.send_kv_chunk", ("self", "req", "last_chunk", "end_idx"),
     "AFTER: fence the pages sent so far (req_to_token row up to req.start_send_idx)"),
    (f"{_PREFILL}.process_disagg_prefill_inflight_queue", ("self",),
     "AFTER: the returned done requests' transfers succeeded unless marked failed; poll drains"),
    (f"{_PREFILL}.handle_inflight_transfer_failure", ("self", "req"),
     "BEFORE: a failed transfer keeps its pages quarantined"),
    (f"{_PREFILL}._retire_aborted_prefill_result", ("self", "req"),
     "BEFORE: an aborted request's pages may still be read by the engine"),
    ("sglang.srt.disaggregation.utils:MetadataBuffers.set_buf", ("self", "req"),
     "AFTER: write the tenant tag into bootstrap_room[idx, 1:3] (SGLang uses column 0 of the 8-wide row)"),
    ("sglang.srt.disaggregation.utils:MetadataBuffers.get_buf_infos", ("self",),
     "bootstrap_room is transferred as one whole 64-byte row per request"),
    (f"{_PREALLOC}._send_kv_metadata", ("self", "decode_req", "kv_indices", "page_size", "state_indices"),
     "AFTER: fence the destination pages published to the prefill"),
    (f"{_TRANSFER}._commit_transfer_to_req", ("self", "decode_req"),
     "AROUND: check the tenant tag before the KV is committed; the transfer is over either way"),
    (f"{_TRANSFER}._abort_failed_transfer", ("self", "decode_req"),
     "BEFORE: a failed transfer's pages wait for the prefill's drain ack"),
    (f"{_TRANSFER}._do_release", ("self", "decode_req", "idx"),
     "BEFORE: read is_abort_release_safe before SGLang clears the ack tracker"),
    (f"{_TRANSFER}.pop_transferred", ("self", "rids_to_check"),
     "AFTER: poll the quarantine once per decode loop"),
    ("sglang.srt.disaggregation.common.conn:CommonKVManager.is_abort_release_safe",
     ("self", "bootstrap_room", "required_acks"), "the decode-side drain signal"),
    ("sglang.srt.disaggregation.common.conn:CommonKVManager._maybe_ack_drained_abort", ("self", "room"),
     "prefill drain predicate we reuse: room Failed (or not in request_status) and _staging_outstanding[room] == 0"),
    ("sglang.srt.disaggregation.common.conn:CommonKVManager.check_status", ("self", "bootstrap_room"),
     "prefill drain probe reads the room's status"),
    ("sglang.srt.disaggregation.common.conn:CommonKVReceiver.abort", ("self",),
     "sets conclude_state (the test stall releases its poll on it)"),
    ("sglang.srt.disaggregation.fake.conn:FakeKVReceiver", (), "moves no KV: drained at once, tag only when tested"),
    ("sglang.srt.disaggregation.fake.conn:FakeKVSender", (), "moves no KV: drained at once"),
    ("sglang.srt.disaggregation.base.conn:KVPoll", (), "Transferring while a test stall holds a transfer"),
    ("sglang.srt.disaggregation.mooncake.conn:MooncakeKVSender", (),
     "platform/pd_cpu.py sets supports_host_tensor_indices = False on CPU (pinned memory + CUDA event otherwise)"),
)  # fmt: skip
