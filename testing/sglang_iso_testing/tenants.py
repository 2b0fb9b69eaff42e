"""One builder for the tenants files of tests, benchmarks and the demo: keys minted, hashes written, TOML checked.

    made = write_tenants_file(tmp_path, {"acme": {"cache": "private"}, "globex": {}}, default_kv_share=1.0)
    made.path            # tmp_path / "tenants.toml" (with tmp_path / "secret.key" beside it)
    made.keys["acme"]    # acme's API key; made.keys["admin"] the admin key

Each tenant's table gets ``id`` and ``key_sha256`` (of the key minted for it, or of ``keys[id]`` when given), then
the fields given for it, in order. The file is parsed back with ``tomllib`` before it is returned, so a value the
writer cannot express fails here, naming the field, not in a server's start-up log.
"""

from __future__ import annotations

import json
import math
import secrets
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_iso.tenancy.keys import key_sha256, new_api_key

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project's CI runs 3.11+
    import tomli as tomllib

ADMIN = "admin"
ROUTER = "router"


@dataclass(frozen=True)
class TenantsFile:
    path: Path
    keys: dict[str, str] = field(default_factory=dict)
    """API key of each tenant id, and of ``"admin"`` / ``"router"`` when the file lists them."""
    secret: bytes = b""


def write_tenants_file(
    directory: Path,
    tenants: Mapping[str, Mapping[str, Any]] | Iterable[str],
    *,
    keys: Mapping[str, str | Sequence[str]] | None = None,
    admin: bool = True,
    router: bool = False,
    shared_prefixes: Sequence[Mapping[str, Any]] = (),
    secret: bytes | None = None,
    name: str = "tenants.toml",
    **top: Any,
) -> TenantsFile:
    """Write ``directory/name`` and ``directory/secret.key``; return the path and every key.

    Args:
        tenants: tenant id -> its fields (``cache``, ``quota_tokens``, ``kv_share``, ...), or just the ids.
        keys: keys to use instead of minting (by tenant id, ``"admin"``, ``"router"``); others are minted. A list
            gives a tenant several keys (a key rotation); :attr:`TenantsFile.keys` holds the first.
        admin: list an admin key (``admin_key_sha256``).
        router: list a router key (``router_key_sha256``, for prefill/decode workers).
        shared_prefixes: ``[[shared_prefixes]]`` tables, as given.
        secret: the namespace secret (32 random bytes when None).
        top: other top-level fields (``default_kv_share``, ...).

    Raises:
        ValueError: a value TOML cannot hold here (the message names the field).
    """
    table = tenants if isinstance(tenants, Mapping) else {tenant: {} for tenant in tenants}
    given = {who: [k] if isinstance(k, str) else list(k) for who, k in (keys or {}).items()}
    listed = {
        who: given.get(who) or [new_api_key()]
        for who in (*table, *((ADMIN,) if admin else ()), *((ROUTER,) if router else ()))
    }
    minted = {who: found[0] for who, found in listed.items()}
    secret = secrets.token_bytes(32) if secret is None else secret
    (directory / "secret.key").write_bytes(secret)
    lines = ['namespace_secret_file = "secret.key"']
    if admin:
        lines.append(f'admin_key_sha256 = ["{key_sha256(minted[ADMIN])}"]')
    if router:
        lines.append(f'router_key_sha256 = ["{key_sha256(minted[ROUTER])}"]')
    lines += [f"{k} = {_value(v, k)}" for k, v in top.items()]
    for tenant, fields in table.items():
        hashes = ", ".join(f'"{key_sha256(k)}"' for k in listed[tenant])
        lines += ["", "[[tenants]]", f"id = {_value(tenant, 'id')}", f"key_sha256 = [{hashes}]"]
        lines += [f"{k} = {_value(v, f'{tenant}.{k}')}" for k, v in fields.items()]
    for prefix in shared_prefixes:
        lines += ["", "[[shared_prefixes]]", *(f"{k} = {_value(v, f'shared_prefixes.{k}')}" for k, v in prefix.items())]
    path = directory / name
    path.write_text("\n".join(lines) + "\n")
    try:
        tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:  # (a writer bug: the values above are all expressible)
        raise ValueError(f"{path}: the tenants file written is not TOML: {exc}") from exc
    return TenantsFile(path, minted, secret)


def _value(value: Any, where: str) -> str:
    """``value`` as a TOML value (strings, numbers, booleans, lists, inline tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v, where) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {_value(v, f'{where}.{k}')}" for k, v in value.items()) + "}"
    raise ValueError(f"tenants file field {where}: {value!r} is not a TOML value this writer handles")
