"""The tag that makes a KV transfer carry its tenant: a MAC over the namespace and the bootstrap room.

The prefill worker computes ``transfer_tag(secret, namespace, room)`` for the
request whose KV it sends and writes it beside the room in the transfer
metadata; the decode worker recomputes it for its own request (whose namespace
its own gate verified) and commits the KV only when both agree. Both workers
load the same tenants file, so they share the namespace secret. A tag is two
62-bit words so that it fits signed and unsigned 64-bit metadata tensors.
"""

from __future__ import annotations

import hashlib
import hmac

TAG_WORDS = 2
_WORD_BITS = 62
_CONTEXT = b"sglang-iso/pd-transfer/v1"


def transfer_tag(secret: bytes, namespace: str | None, room: int) -> tuple[int, int]:
    """The MAC of (``namespace``, ``room``) under ``secret``; never (0, 0) (the metadata's "not written")."""
    message = _CONTEXT + b"\0" + (namespace or "").encode("utf-8") + b"\0" + str(int(room)).encode("ascii")
    digest = hmac.new(secret, message, hashlib.sha256).digest()
    mask = (1 << _WORD_BITS) - 1
    words = (int.from_bytes(digest[:8], "big") & mask, int.from_bytes(digest[8:16], "big") & mask)
    return (words[0] or 1, words[1])


def tag_matches(secret: bytes, namespace: str | None, room: int, received: tuple[int, ...]) -> bool:
    """Constant-time check of a received tag. A missing or short tag never matches."""
    if len(received) != TAG_WORDS:
        return False
    expected = transfer_tag(secret, namespace, room)
    return hmac.compare_digest(
        b"".join(int(w).to_bytes(8, "big") for w in expected),
        b"".join((int(w) & ((1 << 64) - 1)).to_bytes(8, "big") for w in received),
    )
