"""Which tree namespace a request's cache key belongs to, decided in the scheduler.

Two modes:

* ``tenants`` (a namespace secret is configured): the front end writes a tag
  into the request's ``extra_key``. The tag names the tenant and its namespace
  id and carries an HMAC-SHA-256 over both under the server's secret, so the
  scheduler can verify it without trusting how the request arrived. A key with
  no tag, a malformed tag or a bad MAC resolves to no namespace: the request is
  served without any prefix sharing. A malformed or forged tag is an isolation
  violation (counted, logged); no tag at all is an internal request (counted).
* ``open`` (no secret: a single trust domain): the namespace is a hash of an
  unambiguous encoding of ``(extra_key, cache_salt)``, so ``"a"+"bc"`` and
  ``"ab"+"c"`` can never meet, but the client chooses its namespace.

Tag layout (ASCII, ``.``-separated; tenant ids never contain ``.``)::

    iso1.<tenant>.<namespace id, 64 hex>.<mac, 64 hex>[<LoRA id, 32 hex>]
    mac = HMAC-SHA-256(secret, "sglang-iso/ns-tag/v1" 0x00 tenant 0x00 namespace_id)

SGLang appends the id of the request's loaded LoRA adapter to ``extra_key`` with
no separator (``Req.__init__``). The tag has a fixed length, so the suffix is
unambiguous. Clients can set neither ``extra_key`` nor the LoRA id (the gate
refuses both fields and the front end overwrites them), so the suffix is
server-chosen: a tagged key with a suffix is a LoRA request, not a violation.
Its namespace is the tag's (whose identity already names the adapter and its
content hash) narrowed by the LoRA id, i.e. by one load of the adapter weights.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re

from sglang_iso.constants import MIN_SECRET_BYTES
from sglang_iso.names import TENANT_ID_PATTERN

logger = logging.getLogger(__name__)

TAG_VERSION = "iso1"
_MAC_DOMAIN = b"sglang-iso/ns-tag/v1"
_TAG_RE = re.compile(rf"iso1\.({TENANT_ID_PATTERN.pattern})\.([0-9a-f]{{64}})\.([0-9a-f]{{64}})([0-9a-f]{{32}})?")
_LORA_ID_RE = re.compile(r"[0-9a-f]{32}")  # SGLang's LoRA ids: uuid4().hex or uuid5(...).hex


def _mac(secret: bytes, tenant: str, namespace_id: str) -> str:
    msg = _MAC_DOMAIN + b"\x00" + tenant.encode() + b"\x00" + namespace_id.encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def make_tag(secret: bytes, tenant: str, namespace_id: str) -> str:
    """The ``extra_key`` the front end sets for ``tenant``'s namespace ``namespace_id``."""
    return f"{TAG_VERSION}.{tenant}.{namespace_id}.{_mac(secret, tenant, namespace_id)}"


def _frame(*fields: str | None) -> bytes:
    out = bytearray(b"sglang-iso/open-ns/v1")
    for f in fields:
        if f is None:
            out += b"\x00"
        else:
            data = f.encode()
            out += b"\x01" + len(data).to_bytes(8, "big") + data
    return bytes(out)


class NamespaceResolver:
    """Maps a key's ``(extra_key, cache_salt)`` to a tree namespace, or None (no sharing)."""

    def __init__(self, secret: bytes | None) -> None:
        """Raises:
        ValueError: a secret shorter than ``MIN_SECRET_BYTES``.
        """
        if secret is not None and len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"namespace secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}")
        self._secret = secret
        self.rejected_tags = 0  # keys with a malformed or forged tag: isolation violations
        self.untagged = 0  # keys with no tag at all: internal requests (health checks), served unshared

    @property
    def mode(self) -> str:
        return "open" if self._secret is None else "tenants"

    def resolve(self, extra_key: str | None, cache_salt: str | None) -> str | None:
        if self._secret is None:
            return "open:" + hashlib.blake2b(_frame(extra_key, cache_salt), digest_size=16).hexdigest()
        if not extra_key or _LORA_ID_RE.fullmatch(extra_key):
            # The front end tags every authenticated request; untagged ones are internal (e.g. /health),
            # possibly with a LoRA id that SGLang appended to an empty key.
            self.untagged += 1
            return None
        match = _TAG_RE.fullmatch(extra_key)
        if match is None:
            self._reject("missing or malformed namespace tag")
            return None
        tenant, namespace_id, mac, lora_id = match.groups()
        if not hmac.compare_digest(mac, _mac(self._secret, tenant, namespace_id)):
            self._reject(f"bad namespace tag MAC for tenant {tenant!r}")
            return None
        return f"t:{tenant}:{namespace_id}" + (f":{lora_id}" if lora_id else "")

    @staticmethod
    def tenant_of(namespace: str) -> str | None:
        """The tenant id of a ``tenants``-mode namespace."""
        parts = namespace.split(":")
        return parts[1] if len(parts) in (3, 4) and parts[0] == "t" else None

    @staticmethod
    def adapter_of(namespace: str) -> str | None:
        """The LoRA id a ``tenants``-mode namespace is narrowed to; None for base-model namespaces."""
        parts = namespace.split(":")
        return parts[3] if len(parts) == 4 and parts[0] == "t" else None

    def _reject(self, why: str) -> None:
        # SECURITY: fail closed; the request is served, but shares nothing.
        self.rejected_tags += 1
        logger.warning("sglang-iso isolation-violation: %s; serving without prefix sharing", why)
