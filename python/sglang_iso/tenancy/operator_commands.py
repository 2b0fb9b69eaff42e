"""Operator commands for the tenants file: ``sglang-iso keys ...`` and ``sglang-iso check-config FILE``.

``sglang-iso keys new --tenant ID``   mint a key: stdout line 1 is the key (shown once),
                                      line 2 is ``key_sha256 = ["<hex>"]`` to paste under the tenant.
``sglang-iso keys new --admin``       same, line 2 is ``admin_key_sha256 = ["<hex>"]``.
``sglang-iso keys hash``              read one key from stdin, print its SHA-256 hex.
``sglang-iso check-config FILE``      validate a tenants file; print a summary, exit 0, or
                                      print the error to stderr, exit 1.

Every function returns a process exit code (0 ok, 1 invalid input, 2 usage error)
instead of exiting, so the top-level ``sglang-iso`` command can delegate to them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from sglang_iso.names import is_valid_tenant_id
from sglang_iso.tenancy.config import ConfigError, load_tenants_file
from sglang_iso.tenancy.keys import key_sha256, new_api_key

KEYS_PROG = "sglang-iso keys"
CHECK_CONFIG_PROG = "sglang-iso check-config"


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``keys ...`` / ``check-config ...`` (``argv`` excludes the program name)."""
    args = list(sys.argv[1:] if argv is None else argv)
    commands: dict[str, Callable[[Sequence[str]], int]] = {"keys": keys_main, "check-config": check_config_main}
    if not args or args[0] not in commands:
        print(f"usage: sglang-iso {{{','.join(commands)}}} ...", file=sys.stderr)
        return 2
    return commands[args[0]](args[1:])


def keys_main(argv: Sequence[str] | None = None) -> int:
    """``sglang-iso keys {new,hash}``. Writes to stdout/stderr; reads stdin for ``hash``."""
    parser = argparse.ArgumentParser(prog=KEYS_PROG, description="Mint and hash API keys for the tenants file.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{new,hash}")
    new = commands.add_parser("new", help="mint a key; prints it once, then the line to paste into the tenants file")
    who = new.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant", metavar="ID", help="tenant the key is for (must match [a-z0-9][a-z0-9-]{0,63})")
    who.add_argument("--admin", action="store_true", help="mint an admin key (admin_key_sha256)")
    commands.add_parser("hash", help="read a key from stdin and print its SHA-256 hex digest")
    parsed = _parse(parser, argv)
    if isinstance(parsed, int):
        return parsed
    if parsed.command == "new":
        return _keys_new(parsed.tenant, parsed.admin)
    return _keys_hash()


def check_config_main(argv: Sequence[str] | None = None) -> int:
    """``sglang-iso check-config FILE``: validate a tenants file. Reads it and its secret; writes stdout/stderr."""
    parser = argparse.ArgumentParser(prog=CHECK_CONFIG_PROG, description="Validate a tenants file.")
    parser.add_argument("file", metavar="FILE", help="tenants file (TOML)")
    parsed = _parse(parser, argv)
    if isinstance(parsed, int):
        return parsed
    try:
        config = load_tenants_file(parsed.file)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    groups = {tenant.group for tenant in config.tenants.values() if tenant.group is not None}
    print(
        f"{config.source}: {_count(len(config.tenants), 'tenant')}, "
        f"{_count(len(config.shared_prefixes), 'shared prefix', 'shared prefixes')}, "
        f"{_count(len(config.admin_key_hashes), 'admin key')}, {_count(len(groups), 'cache group')}: OK"
    )
    return 0


def _keys_new(tenant: str | None, admin: bool) -> int:
    if not admin and not is_valid_tenant_id(tenant):
        print(f"error: --tenant: invalid tenant id {tenant!r}; must match [a-z0-9][a-z0-9-]{{0,63}}", file=sys.stderr)
        return 1
    key = new_api_key()
    field = "admin_key_sha256" if admin else "key_sha256"
    print(key)
    print(f'{field} = ["{key_sha256(key)}"]')
    where = "at the top level of the tenants file" if admin else f'under the [[tenants]] entry with id = "{tenant}"'
    print(f"# The key above is shown only once: store it now. Paste the {field} line {where}.", file=sys.stderr)
    return 0


def _keys_hash() -> int:
    lines = sys.stdin.read().strip().splitlines()
    if len(lines) != 1:
        print(f"error: stdin: expected exactly one key on one line, got {len(lines)} lines", file=sys.stderr)
        return 1
    try:
        digest = key_sha256(lines[0].strip())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(digest)
    return 0


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    """Parsed args, or the exit code argparse wanted (``--help``: 0, usage error: 2)."""
    try:
        return parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2


def _count(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n} {singular if n == 1 else plural or singular + 's'}"
