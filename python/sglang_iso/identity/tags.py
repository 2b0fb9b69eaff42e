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
from typing import Literal, NamedTuple

from sglang_iso.constants import MIN_SECRET_BYTES, SHARED_NAMESPACE_PREFIX
from sglang_iso.names import TENANT_ID_PATTERN

logger = logging.getLogger(__name__)

TAG_VERSION = "iso1"
_MAC_DOMAIN = b"sglang-iso/ns-tag/v1"
_TAG_RE = re.compile(rf"iso1\.({TENANT_ID_PATTERN.pattern})\.([0-9a-f]{{64}})\.([0-9a-f]{{64}})([0-9a-f]{{32}})?")
_LORA_ID_RE = re.compile(r"[0-9a-f]{32}")  # SGLang's LoRA ids: uuid4().hex or uuid5(...).hex
VERIFIED_TAGS = 4096
"""Verified tags a resolver remembers (about 1 MB): more than the namespaces a scheduler has in flight."""


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


class Namespace(NamedTuple):
    """A tree namespace: what the resolver decided, with its fields, and the key the tree files it under.

    Made by :class:`NamespaceResolver` (tenant and open namespaces) or :meth:`shared_prefix`; code that holds
    only a key reads it back with :meth:`parse`, the one reader of the key format::

        t:<tenant>:<namespace id>[:<LoRA id>]   tenants mode: a verified tag (tenant = the tag's owner)
        open:<hash>                             open mode: hash of (extra_key, cache_salt)
        shared:<name>                           an operator-declared shared prefix
    """

    kind: Literal["tenant", "open", "shared"]
    key: str
    """The tree's namespace id (dict key of the tree, the tiers, the owner table and the NGRAM corpora)."""
    tenant: str | None = None
    """The tag's owner (tenant id or cache group); None for open and shared namespaces."""
    adapter: str | None = None
    """The LoRA load id the namespace is narrowed to; None for the base model."""
    shared: str | None = None
    """The declared shared prefix's name (``kind == "shared"``)."""

    @classmethod
    def of_tenant(cls, tenant: str, namespace_id: str, adapter: str | None = None) -> Namespace:
        key = f"t:{tenant}:{namespace_id}" + (f":{adapter}" if adapter else "")
        return cls("tenant", key, tenant=tenant, adapter=adapter or None)

    @classmethod
    def shared_prefix(cls, name: str) -> Namespace:
        return cls("shared", SHARED_NAMESPACE_PREFIX + name, shared=name)

    @classmethod
    def parse(cls, key: str) -> Namespace | None:
        """The namespace a key names, or None for a key of no known shape."""
        if key.startswith(SHARED_NAMESPACE_PREFIX):
            return cls.shared_prefix(key[len(SHARED_NAMESPACE_PREFIX) :])
        if key.startswith("open:"):
            return cls("open", key)
        parts = key.split(":")
        if parts[0] == "t" and len(parts) in (3, 4):
            return cls.of_tenant(parts[1], parts[2], parts[3] if len(parts) == 4 else None)
        return None

    @property
    def owner(self) -> str:
        """Whose quotas, flushes and rows the namespace counts under: the tenant, or ``"open"``."""
        return self.tenant or "open"


def tenant_of(key: str | None) -> str | None:
    """The tenant id of a tenants-mode namespace key (None for any other key)."""
    ns = Namespace.parse(key) if key else None
    return ns.tenant if ns is not None else None


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
        self._verified: dict[str, Namespace] = {}
        """Tags whose MAC verified under this resolver's secret (fixed for its life), by the exact ``extra_key``:
        the scheduler resolves each request's key several times (match, row owner, checkpoints). Only verified
        tags are kept, at most :data:`VERIFIED_TAGS` (the oldest dropped first); a forged one is checked and
        counted every time."""

    @property
    def mode(self) -> str:
        return "open" if self._secret is None else "tenants"

    def resolve(self, extra_key: str | None, cache_salt: str | None) -> str | None:
        """The key of :meth:`resolve_namespace`'s namespace, or None."""
        ns = self.resolve_namespace(extra_key, cache_salt)
        return ns.key if ns is not None else None

    def resolve_namespace(self, extra_key: str | None, cache_salt: str | None) -> Namespace | None:
        """The namespace a key's ``(extra_key, cache_salt)`` belongs to; None: no sharing (counted)."""
        if self._secret is None:
            return Namespace(
                "open", "open:" + hashlib.blake2b(_frame(extra_key, cache_salt), digest_size=16).hexdigest()
            )
        if not extra_key or _LORA_ID_RE.fullmatch(extra_key):
            # The front end tags every authenticated request; untagged ones are internal (e.g. /health),
            # possibly with a LoRA id that SGLang appended to an empty key.
            self.untagged += 1
            return None
        known = self._verified.get(extra_key)
        if known is not None:
            return known
        match = _TAG_RE.fullmatch(extra_key)
        if match is None:
            self._reject("missing or malformed namespace tag")
            return None
        tenant, namespace_id, mac, lora_id = match.groups()
        if not hmac.compare_digest(mac, _mac(self._secret, tenant, namespace_id)):
            self._reject(f"bad namespace tag MAC for tenant {tenant!r}")
            return None
        namespace = Namespace.of_tenant(tenant, namespace_id, lora_id)
        if len(self._verified) >= VERIFIED_TAGS:
            del self._verified[next(iter(self._verified))]
        self._verified[extra_key] = namespace
        return namespace

    def _reject(self, why: str) -> None:
        # SECURITY: fail closed; the request is served, but shares nothing.
        self.rejected_tags += 1
        logger.warning("sglang-iso isolation-violation: %s; serving without prefix sharing", why)
