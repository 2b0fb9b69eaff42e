"""Tests for load_tenants_file: valid files, and a ConfigError naming field (and line) for each invalid one."""

from __future__ import annotations

import base64
import dataclasses
import os
from pathlib import Path

import pytest

from sglang_iso.tenancy import ConfigError, PrefixMessage, TenantsConfig, load_tenants_file

from .conftest import ACME_HASH, ADMIN_HASH, GLOBEX_HASH, HEADER, VALID_BODY, WriteTenants

ENV_HEADER = f'namespace_secret_env = "SGLANG_ISO_TEST_SECRET"\nadmin_key_sha256 = ["{ADMIN_HASH}"]\n'
ONE_TENANT = f'\n[[tenants]]\nid = "acme"\nkey_sha256 = ["{ACME_HASH}"]\n'
"""Lines 3-6 after HEADER: blank, [[tenants]] (4), id (5), key_sha256 (6)."""


def load_error(path: Path, **kwargs: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_tenants_file(path, **kwargs)  # type: ignore[arg-type]
    error = info.value
    assert str(path) in str(error)
    return error


# --- valid files -------------------------------------------------------------------------------------------------


def test_valid_file_loads(write_tenants: WriteTenants, secret_bytes: bytes) -> None:
    path = write_tenants(VALID_BODY)
    config = load_tenants_file(path)
    assert config.source == path
    assert config.secret == secret_bytes
    assert config.admin_key_hashes == frozenset({ADMIN_HASH})
    assert list(config.tenants) == ["acme", "globex", "initech"]
    acme, globex, initech = config.tenants.values()
    assert (acme.key_hashes, acme.quota_tokens, acme.cache_policy, acme.group) == (
        frozenset({ACME_HASH}),
        200000,
        "private",
        None,
    )
    assert (globex.key_hashes, globex.quota_tokens, globex.cache_policy, globex.group) == (
        frozenset({GLOBEX_HASH}),
        None,
        "private",
        "partners",
    )
    assert initech.cache_policy == "off"
    support, chat = config.shared_prefixes
    assert (support.name, support.text, support.messages) == (
        "support-bot-v1",
        "You are the support assistant of ...",
        None,
    )
    assert support.tenants == frozenset({"acme", "globex"})
    assert chat.text is None
    assert chat.messages == (PrefixMessage("system", "Be brief."), PrefixMessage("user", "Hi"))
    assert chat.tenants == "*"


def test_config_is_frozen_and_repr_hides_secret(write_tenants: WriteTenants, secret_bytes: bytes) -> None:
    config = load_tenants_file(write_tenants(VALID_BODY))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.secret = b"x" * 32  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.tenants["acme"].quota_tokens = 1  # type: ignore[misc]
    assert secret_bytes.hex() not in repr(config)
    assert repr(secret_bytes) not in repr(config)
    assert "redacted" in repr(config)


def test_minimal_file_defaults(write_tenants: WriteTenants) -> None:
    config = load_tenants_file(write_tenants(ONE_TENANT, header='namespace_secret_file = "secret.key"\n'))
    assert config.admin_key_hashes == frozenset()
    assert config.shared_prefixes == ()
    tenant = config.tenants["acme"]
    assert (tenant.quota_tokens, tenant.cache_policy, tenant.group) == (None, "private", None)
    assert (tenant.host_quota_tokens, tenant.l3_quota_tokens) == (None, None)


def test_tier_quotas_default_and_override(write_tenants: WriteTenants) -> None:
    header = 'namespace_secret_file = "secret.key"\n'
    inherited = load_tenants_file(write_tenants(ONE_TENANT + "quota_tokens = 500\n", header=header))
    tenant = inherited.tenants["acme"]
    assert (tenant.quota_tokens, tenant.host_quota_tokens, tenant.l3_quota_tokens) == (500, 500, None)
    own = ONE_TENANT + "quota_tokens = 500\nhost_quota_tokens = 2000\nl3_quota_tokens = 9000\n"
    tenant = load_tenants_file(write_tenants(own, header=header)).tenants["acme"]
    assert (tenant.quota_tokens, tenant.host_quota_tokens, tenant.l3_quota_tokens) == (500, 2000, 9000)


@pytest.mark.parametrize("encoding", ["raw", "hex", "hex-upper-newline", "base64", "base64-urlsafe-unpadded"])
def test_secret_file_encodings(write_tenants: WriteTenants, secret_bytes: bytes, encoding: str) -> None:
    encoded: dict[str, bytes | str] = {
        "raw": secret_bytes,
        "hex": secret_bytes.hex(),
        "hex-upper-newline": secret_bytes.hex().upper() + "\n",
        "base64": base64.b64encode(secret_bytes).decode() + "\n",
        "base64-urlsafe-unpadded": base64.urlsafe_b64encode(secret_bytes).decode().rstrip("="),
    }
    secret = encoded[encoding]
    assert load_tenants_file(write_tenants(ONE_TENANT, secret=secret)).secret == secret_bytes


def test_secret_file_is_relative_to_tenants_file(
    write_tenants: WriteTenants, secret_bytes: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_tenants(ONE_TENANT)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_tenants_file(os.path.relpath(path, elsewhere)).secret == secret_bytes


def test_secret_via_env(write_tenants: WriteTenants, secret_bytes: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_tenants(ONE_TENANT, header=ENV_HEADER, secret=None)
    monkeypatch.setenv("SGLANG_ISO_TEST_SECRET", secret_bytes.hex())
    assert load_tenants_file(path).secret == secret_bytes
    environ = {"SGLANG_ISO_TEST_SECRET": base64.b64encode(secret_bytes).decode()}
    assert load_tenants_file(path, environ=environ).secret == secret_bytes
    raw_text = "correct horse battery staple, 32+ chars long!"
    assert load_tenants_file(path, environ={"SGLANG_ISO_TEST_SECRET": raw_text}).secret == raw_text.encode()


def test_returns_tenants_config(write_tenants: WriteTenants) -> None:
    assert isinstance(load_tenants_file(write_tenants(VALID_BODY)), TenantsConfig)


# --- errors with a line number -----------------------------------------------------------------------------------

LINE_CASES = [
    pytest.param("\n[[tenants]]\nid = acme\n", None, 5, "TOML syntax error", id="toml-syntax"),
    pytest.param('colour = "red"\n' + ONE_TENANT, "colour", 3, "unknown field", id="unknown-top-field"),
    pytest.param(ONE_TENANT + "quota = 5\n", "tenants[0].quota", 7, "unknown field", id="unknown-tenant-field"),
    pytest.param(
        ONE_TENANT + '\n[[tenants]]\nkey_sha256 = ["' + "1" * 64 + '"]\n',
        "tenants[1].id",
        8,
        "missing required field",
        id="missing-tenant-id",
    ),
    pytest.param(ONE_TENANT.replace('"acme"', '"Acme"'), "tenants[0].id", 5, "invalid tenant id", id="bad-tenant-id"),
    pytest.param(ONE_TENANT.replace('"acme"', "5"), "tenants[0].id", 5, "must be a string", id="tenant-id-type"),
    pytest.param(
        ONE_TENANT + '\n[[tenants]]\nid = "acme"\nkey_sha256 = ["' + "1" * 64 + '"]\n',
        "tenants[1].id",
        9,
        "duplicate tenant id",
        id="duplicate-tenant-id",
    ),
    pytest.param(
        ONE_TENANT + '\n[[tenants]]\nid = "globex"\nkey_sha256 = [\n  "' + "1" * 64 + '",\n  "' + ACME_HASH + '",\n]\n',
        "tenants[1].key_sha256[1]",
        12,
        "already used by tenants[0].key_sha256[0]",
        id="duplicate-hash-across-tenants",
    ),
    pytest.param(
        ONE_TENANT.replace(ACME_HASH, ADMIN_HASH),
        "tenants[0].key_sha256[0]",
        6,
        "already used by admin_key_sha256[0]",
        id="duplicate-hash-admin-tenant",
    ),
    pytest.param(
        ONE_TENANT.replace(ACME_HASH, f'{ACME_HASH}",\n  "{ACME_HASH}'),
        "tenants[0].key_sha256[1]",
        7,
        "exactly one principal",
        id="duplicate-hash-same-tenant",
    ),
    pytest.param(
        ONE_TENANT.replace(f'["{ACME_HASH}"]', f'[\n  "{GLOBEX_HASH}",\n  "{ACME_HASH.upper()}",\n]'),
        "tenants[0].key_sha256[1]",
        8,
        "64 lowercase hex",
        id="uppercase-hash-multiline",
    ),
    pytest.param(ONE_TENANT + "quota_tokens = 0\n", "tenants[0].quota_tokens", 7, "positive integer", id="quota-zero"),
    pytest.param(ONE_TENANT + 'cache = "shared"\n', "tenants[0].cache", 7, "invalid cache policy", id="bad-cache"),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\nname = "p"\ntext = "x"\ntenants = ["acme", "nobody"]\n',
        "shared_prefixes[0].tenants[1]",
        11,
        "unknown tenant 'nobody'",
        id="unknown-prefix-tenant",
    ),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\nname = "p"\ntext = "x"\nmessages = []\ntenants = ["*"]\n',
        "shared_prefixes[0].text",
        8,
        "exactly one of text and messages",
        id="prefix-text-and-messages",
    ),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\nname = "p"\ntenants = ["*"]\n',
        "shared_prefixes[0].text",
        8,
        "got neither",
        id="prefix-neither-text-nor-messages",
    ),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\nname = "p"\ntext = "x"\ntenants = ["*"]\n'
        '\n[[shared_prefixes]]\nname = "p"\ntext = "y"\ntenants = ["*"]\n',
        "shared_prefixes[1].name",
        14,
        "duplicate shared prefix name",
        id="duplicate-prefix-name",
    ),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\nname = "p"\ntext = "x"\ntenants = ["*"]\nmode = 1\n',
        "shared_prefixes[0].mode",
        12,
        "unknown field",
        id="unknown-prefix-field",
    ),
]


@pytest.mark.parametrize(("body", "field", "line", "reason"), LINE_CASES)
def test_error_names_field_and_line(
    write_tenants: WriteTenants, body: str, field: str | None, line: int, reason: str
) -> None:
    path = write_tenants(body)
    error = load_error(path)
    assert (error.field, error.line) == (field, line), str(error)
    assert reason in str(error)
    assert str(error).startswith(f"{path}:{line}: ")
    if field is not None:
        assert f": {field}: " in str(error)


def test_secret_errors_point_at_their_line(write_tenants: WriteTenants) -> None:
    error = load_error(write_tenants(ONE_TENANT, secret=None))
    assert (error.field, error.line) == ("namespace_secret_file", 1)
    assert "cannot read secret file" in error.reason


# --- errors without a promised line ------------------------------------------------------------------------------

FIELD_CASES = [
    pytest.param("", "tenants", "missing required field", id="no-tenants"),
    pytest.param('tenants = "acme"\n', "tenants", "must be an array of tables", id="tenants-wrong-type"),
    pytest.param(
        ONE_TENANT.replace(f'key_sha256 = ["{ACME_HASH}"]', ""),
        "tenants[0].key_sha256",
        "missing required field",
        id="missing-key-sha256",
    ),
    pytest.param(
        ONE_TENANT.replace(f'["{ACME_HASH}"]', "[]"), "tenants[0].key_sha256", "at least one", id="empty-key-sha256"
    ),
    pytest.param(
        ONE_TENANT.replace(f'["{ACME_HASH}"]', f'"{ACME_HASH}"'),
        "tenants[0].key_sha256",
        "must be an array of strings",
        id="key-sha256-not-array",
    ),
    pytest.param(
        ONE_TENANT.replace(f'"{ACME_HASH}"', "12"),
        "tenants[0].key_sha256[0]",
        "must be a string",
        id="key-hash-not-string",
    ),
    pytest.param(
        ONE_TENANT.replace(ACME_HASH, ACME_HASH[:63]), "tenants[0].key_sha256[0]", "64 lowercase hex", id="short-hash"
    ),
    pytest.param(ONE_TENANT + "quota_tokens = -5\n", "tenants[0].quota_tokens", "positive integer", id="quota-neg"),
    pytest.param(ONE_TENANT + 'quota_tokens = "100"\n', "tenants[0].quota_tokens", "got string", id="quota-str"),
    pytest.param(ONE_TENANT + "quota_tokens = true\n", "tenants[0].quota_tokens", "got boolean", id="quota-bool"),
    pytest.param(ONE_TENANT + "quota_tokens = 1.5\n", "tenants[0].quota_tokens", "positive integer", id="quota-float"),
    pytest.param(
        ONE_TENANT + "host_quota_tokens = 0\n", "tenants[0].host_quota_tokens", "positive integer", id="host-quota-zero"
    ),
    pytest.param(
        ONE_TENANT + 'l3_quota_tokens = "1G"\n', "tenants[0].l3_quota_tokens", "got string", id="l3-quota-str"
    ),
    pytest.param(ONE_TENANT + "l3_quota_tokens = -1\n", "tenants[0].l3_quota_tokens", "positive integer", id="l3-neg"),
    pytest.param(ONE_TENANT + 'cache = "group:"\n', "tenants[0].cache", "invalid cache policy", id="empty-group"),
    pytest.param(ONE_TENANT + 'cache = "group:Bad"\n', "tenants[0].cache", "invalid cache policy", id="bad-group"),
    pytest.param(ONE_TENANT + "cache = 1\n", "tenants[0].cache", "must be a string", id="cache-type"),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\ntext = "x"\ntenants = ["*"]\n',
        "shared_prefixes[0].name",
        "missing required field",
        id="prefix-missing-name",
    ),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\nname = "p"\ntext = "x"\n',
        "shared_prefixes[0].tenants",
        "missing required field",
        id="prefix-missing-tenants",
    ),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\nname = "p"\ntext = "x"\ntenants = []\n',
        "shared_prefixes[0].tenants",
        "at least one",
        id="prefix-empty-tenants",
    ),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\nname = "p"\ntext = "x"\ntenants = ["*", "acme"]\n',
        "shared_prefixes[0].tenants[0]",
        "only entry",
        id="prefix-star-mixed",
    ),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\nname = "p"\ntext = ""\ntenants = ["*"]\n',
        "shared_prefixes[0].text",
        "must not be empty",
        id="prefix-empty-text",
    ),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\nname = "p q"\ntext = "x"\ntenants = ["*"]\n',
        "shared_prefixes[0].name",
        "invalid name",
        id="prefix-bad-name",
    ),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\nname = "p"\nmessages = [{role = "system"}]\ntenants = ["*"]\n',
        "shared_prefixes[0].messages[0].content",
        "missing required field",
        id="message-no-content",
    ),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\nname = "p"\nmessages = [{role = "system", content = "x", n = 1}]'
        '\ntenants = ["*"]\n',
        "shared_prefixes[0].messages[0].n",
        "unknown field",
        id="message-extra",
    ),
    pytest.param(
        ONE_TENANT + '\n[[shared_prefixes]]\nname = "p"\nmessages = ["hi"]\ntenants = ["*"]\n',
        "shared_prefixes[0].messages",
        "array of tables",
        id="messages-not-tables",
    ),
]


@pytest.mark.parametrize(("body", "field", "reason"), FIELD_CASES)
def test_error_names_field(write_tenants: WriteTenants, body: str, field: str, reason: str) -> None:
    error = load_error(write_tenants(body))
    assert error.field == field, str(error)
    assert reason in error.reason, str(error)
    assert f": {field}: " in str(error)


def test_raw_key_pasted_as_hash_is_not_echoed(write_tenants: WriteTenants) -> None:
    raw = "sk-iso-" + "A" * 43
    error = load_error(write_tenants(ONE_TENANT.replace(ACME_HASH, raw)))
    assert error.field == "tenants[0].key_sha256[0]"
    assert "raw API key" in str(error)
    assert raw not in str(error)


# --- secret errors -----------------------------------------------------------------------------------------------


def test_secret_too_short(write_tenants: WriteTenants) -> None:
    error = load_error(write_tenants(ONE_TENANT, secret=os.urandom(16).hex()))
    assert error.field == "namespace_secret_file"
    assert "16 bytes after hex decoding" in error.reason


def test_secret_file_empty(write_tenants: WriteTenants) -> None:
    error = load_error(write_tenants(ONE_TENANT, secret="\n"))
    assert (error.field, error.line) == ("namespace_secret_file", 1)
    assert "empty" in error.reason


def test_secret_file_is_directory(write_tenants: WriteTenants) -> None:
    path = write_tenants(ONE_TENANT, secret=None)
    (path.parent / "secret.key").mkdir()
    error = load_error(path)
    assert error.field == "namespace_secret_file"
    assert "cannot read" in error.reason


def test_secret_env_unset_and_short(write_tenants: WriteTenants) -> None:
    path = write_tenants(ONE_TENANT, header=ENV_HEADER, secret=None)
    error = load_error(path, environ={})
    assert (error.field, error.line) == ("namespace_secret_env", 1)
    assert "not set" in error.reason
    error = load_error(path, environ={"SGLANG_ISO_TEST_SECRET": "ab" * 31})
    assert "31 bytes" in error.reason
    assert "ab" * 31 not in str(error)


def test_both_secret_sources(write_tenants: WriteTenants) -> None:
    header = HEADER + 'namespace_secret_env = "X"\n'
    error = load_error(write_tenants(ONE_TENANT, header=header), environ={"X": "ab" * 32})
    assert (error.field, error.line) == ("namespace_secret_file", 3)
    assert "only one of" in error.reason


def test_no_secret_source(write_tenants: WriteTenants) -> None:
    error = load_error(write_tenants(ONE_TENANT, header=""))
    assert error.field == "namespace_secret_file"
    assert "one of namespace_secret_file and namespace_secret_env is required" in error.reason


def test_secret_file_wrong_type(write_tenants: WriteTenants) -> None:
    error = load_error(write_tenants(ONE_TENANT, header="namespace_secret_file = 3\n"))
    assert (error.field, error.line) == ("namespace_secret_file", 1)
    assert "must be a string" in error.reason


# --- file-level errors -------------------------------------------------------------------------------------------


def test_missing_tenants_file(tmp_path: Path) -> None:
    error = load_error(tmp_path / "nope.toml")
    assert error.field is None
    assert "cannot read tenants file" in str(error)


def test_non_utf8_tenants_file(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_bytes(b'id = "\xff"\n')
    assert "not UTF-8" in str(load_error(path))


# --- LoRA adapter allow-lists ------------------------------------------------------------------------------------


def test_adapters_default_to_none_and_load(write_tenants: WriteTenants) -> None:
    config = load_tenants_file(write_tenants(ONE_TENANT))
    assert config.tenants["acme"].adapters == frozenset()
    body = ONE_TENANT + 'adapters = ["acme-support", "org/acme.v2"]\n'
    assert load_tenants_file(write_tenants(body)).tenants["acme"].adapters == frozenset({"acme-support", "org/acme.v2"})
    assert load_tenants_file(write_tenants(ONE_TENANT + "adapters = []\n")).tenants["acme"].adapters == frozenset()


ADAPTER_CASES = [
    pytest.param('adapters = "acme"\n', "tenants[0].adapters", 7, "must be an array of strings", id="not-array"),
    pytest.param("adapters = [1]\n", "tenants[0].adapters[0]", 7, "must be a string", id="not-string"),
    pytest.param('adapters = ["a b"]\n', "tenants[0].adapters[0]", 7, "invalid adapter name", id="bad-name"),
    pytest.param('adapters = ["x:y"]\n', "tenants[0].adapters[0]", 7, "invalid adapter name", id="colon"),
    pytest.param('adapters = [""]\n', "tenants[0].adapters[0]", 7, "invalid adapter name", id="empty"),
    pytest.param('adapters = [\n  "a",\n  "a",\n]\n', "tenants[0].adapters[1]", 9, "listed twice", id="duplicate"),
    pytest.param('adapter = ["a"]\n', "tenants[0].adapter", 7, "unknown field", id="misspelt"),
]


@pytest.mark.parametrize(("line_text", "field", "line", "reason"), ADAPTER_CASES)
def test_adapter_errors_name_field_and_line(
    write_tenants: WriteTenants, line_text: str, field: str, line: int, reason: str
) -> None:
    path = write_tenants(ONE_TENANT + line_text)
    error = load_error(path)
    assert (error.field, error.line) == (field, line), str(error)
    assert reason in error.reason, str(error)


# --- KV shares ---------------------------------------------------------------------------------------------------


def test_kv_share_defaults_leave_room_for_other_tenants(write_tenants: WriteTenants) -> None:
    two = ONE_TENANT + f'\n[[tenants]]\nid = "globex"\nkey_sha256 = ["{GLOBEX_HASH}"]\nkv_share = 0.25\n'
    config = load_tenants_file(write_tenants(two))
    assert config.kv_share_of("acme") == 0.5 and config.kv_share_of("globex") == 0.25
    assert config.kv_share_of("nobody") == 0.5  # an owner the file does not name gets the default
    assert load_tenants_file(write_tenants(ONE_TENANT)).kv_share_of("acme") == 1.0  # no other tenant to leave room for
    explicit = load_tenants_file(write_tenants(two, header=HEADER + "default_kv_share = 0.3\n"))
    assert explicit.kv_share_of("acme") == 0.3 and explicit.kv_share_of("globex") == 0.25


def test_group_holds_the_largest_share_of_its_members(write_tenants: WriteTenants) -> None:
    body = (
        f'\n[[tenants]]\nid = "acme"\nkey_sha256 = ["{ACME_HASH}"]\ncache = "group:team"\nkv_share = 0.2\n'
        f'\n[[tenants]]\nid = "globex"\nkey_sha256 = ["{GLOBEX_HASH}"]\ncache = "group:team"\nkv_share = 0.4\n'
    )
    config = load_tenants_file(write_tenants(body))
    assert config.kv_share_of("team") == 0.4 and config.kv_share_of("acme") == 1.0  # "acme" owns no namespace


@pytest.mark.parametrize("value", ["0", "1.5", "-0.1", "true", '"half"'])
def test_bad_kv_share_is_an_error_naming_the_field(write_tenants: WriteTenants, value: str) -> None:
    error = load_error(write_tenants(ONE_TENANT + f"kv_share = {value}\n"))
    assert error.field == "tenants[0].kv_share" and "at most 1" in str(error)
    error = load_error(write_tenants(ONE_TENANT, header=HEADER + f"default_kv_share = {value}\n"))
    assert error.field == "default_kv_share"
