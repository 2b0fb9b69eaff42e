"""Reading the namespace secret (the HMAC key of :class:`~sglang_iso.identity.NamespaceKeyer`).

Accepted encodings, tried in this order, for both a file and an environment variable:

1. **hex** text: after stripping surrounding whitespace, only ``[0-9a-fA-F]``, even length.
   ``openssl rand -hex 32 > secret.key`` makes one.
2. **base64** text (standard or URL-safe alphabet, padding optional): after stripping,
   only base64 characters. ``openssl rand -base64 32 > secret.key`` makes one.
3. otherwise **raw**: a file's bytes are used verbatim (no stripping, so a binary
   ``head -c 32 /dev/urandom > secret.key`` works); an environment variable's
   value is used as its UTF-8 bytes.

Whatever the encoding, the decoded secret must be at least
:data:`~sglang_iso.constants.MIN_SECRET_BYTES` (32) bytes. Nothing here mutates
state; functions raise :class:`SecretError` with a reason that never contains
the secret itself.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from sglang_iso.constants import MIN_SECRET_BYTES

MAX_SECRET_FILE_BYTES = 64 * 1024
"""A larger file is refused: it is almost certainly the wrong path (a model, a log)."""

_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]+={0,2}")


class SecretError(ValueError):
    """The secret could not be read or is too weak. The message never includes secret material."""


class Secret(NamedTuple):
    """A decoded secret and how it was written (for summaries; the value is never printed)."""

    value: bytes
    """The HMAC key, at least ``MIN_SECRET_BYTES`` long."""
    encoding: str
    """``"hex"``, ``"base64"`` or ``"raw"``."""


def read_secret_file(path: Path) -> Secret:
    """Read and decode the secret in ``path``. Raises :class:`SecretError`."""
    try:
        size = path.stat().st_size
        if size > MAX_SECRET_FILE_BYTES:
            raise SecretError(f"secret file {str(path)!r} is {size} bytes; at most {MAX_SECRET_FILE_BYTES} allowed")
        raw = path.read_bytes()
    except OSError as exc:
        raise SecretError(f"cannot read secret file {str(path)!r}: {exc.strerror or exc}") from None
    if not raw.strip():
        raise SecretError(f"secret file {str(path)!r} is empty")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return _checked(Secret(raw, "raw"), f"secret file {str(path)!r}")
    decoded = _decode_text(text)
    return _checked(decoded or Secret(raw, "raw"), f"secret file {str(path)!r}")


def read_secret_env(name: str, environ: Mapping[str, str]) -> Secret:
    """Read and decode the secret in environment variable ``name``. Raises :class:`SecretError`."""
    value = environ.get(name)
    if value is None:
        raise SecretError(f"environment variable {name!r} is not set")
    if not value.strip():
        raise SecretError(f"environment variable {name!r} is empty")
    decoded = _decode_text(value)
    return _checked(
        decoded or Secret(value.encode("utf-8", "surrogateescape"), "raw"), f"environment variable {name!r}"
    )


def _decode_text(text: str) -> Secret | None:
    """Hex or base64 decoding of ``text``, or ``None`` if it is neither."""
    stripped = text.strip()
    if _HEX.fullmatch(stripped):
        return Secret(bytes.fromhex(stripped), "hex")
    if _BASE64.fullmatch(stripped):
        body = stripped.rstrip("=").replace("-", "+").replace("_", "/")
        if len(body) % 4 == 1:
            return None
        try:
            return Secret(base64.b64decode(body + "=" * (-len(body) % 4), validate=True), "base64")
        except binascii.Error:
            return None
    return None


def _checked(secret: Secret, where: str) -> Secret:
    if len(secret.value) < MIN_SECRET_BYTES:
        raise SecretError(
            f"{where} holds {len(secret.value)} bytes after {secret.encoding} decoding; "
            f"at least {MIN_SECRET_BYTES} random bytes are required (e.g. `openssl rand -hex 32`)"
        )
    return secret
