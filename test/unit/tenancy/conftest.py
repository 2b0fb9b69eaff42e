"""Fixtures for tenancy tests: tenants files and secrets written into ``tmp_path``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sglang_iso.tenancy import key_sha256

ACME_KEY = "sk-iso-acme-test-key"
GLOBEX_KEY = "sk-iso-globex-test-key"
ADMIN_KEY = "sk-iso-admin-test-key"
ACME_HASH = key_sha256(ACME_KEY)
GLOBEX_HASH = key_sha256(GLOBEX_KEY)
ADMIN_HASH = key_sha256(ADMIN_KEY)

HEADER = f'namespace_secret_file = "secret.key"\nadmin_key_sha256 = ["{ADMIN_HASH}"]\n'
"""Lines 1-2 of most test files; the body passed to ``write_tenants`` starts on line 3."""

VALID_BODY = f"""
[[tenants]]
id = "acme"
key_sha256 = ["{ACME_HASH}"]
quota_tokens = 200000

[[tenants]]
id = "globex"
key_sha256 = [
  "{GLOBEX_HASH}",
]
cache = "group:partners"

[[tenants]]
id = "initech"
key_sha256 = ["{"0" * 64}"]
cache = "off"

[[shared_prefixes]]
name = "support-bot-v1"
text = "You are the support assistant of ..."
tenants = ["acme", "globex"]

[[shared_prefixes]]
name = "chat.v2"
messages = [{{role = "system", content = "Be brief."}}, {{role = "user", content = "Hi"}}]
tenants = ["*"]
"""

WriteTenants = Callable[..., Path]


@pytest.fixture
def secret_bytes() -> bytes:
    return os.urandom(32)


@pytest.fixture
def write_tenants(tmp_path: Path, secret_bytes: bytes) -> WriteTenants:
    """``write_tenants(body, header=HEADER, secret=<32 random bytes as hex>)`` -> path of the tenants file.

    Writes ``secret.key`` (``secret`` may be ``bytes`` written verbatim, ``str`` written as text,
    or ``None`` for no file) next to ``tenants.toml`` in ``tmp_path / "conf"``.
    """

    def write(body: str, header: str = HEADER, secret: bytes | str | None = secret_bytes.hex()) -> Path:
        folder = tmp_path / "conf"
        folder.mkdir(exist_ok=True)
        if isinstance(secret, bytes):
            (folder / "secret.key").write_bytes(secret)
        elif isinstance(secret, str):
            (folder / "secret.key").write_text(secret)
        path = folder / "tenants.toml"
        path.write_text(header + body)
        return path

    return write
