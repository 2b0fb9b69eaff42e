"""Retention bookkeeping: which owners' caches are due to be dropped, on a fake clock, and the tenants file fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_iso.server.retention import IDLE, MAX_AGE, Policy, Retention, policies
from sglang_iso.tenancy.config import ConfigError, load_tenants_file
from sglang_iso_testing.tenants import write_tenants_file


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_idle_ttl_drops_only_after_the_last_request_ended_and_only_the_idle_owner() -> None:
    clock = Clock()
    r = Retention({"acme": Policy(ttl_s=10), "globex": Policy(ttl_s=10)}, clock)
    assert r.due() == []
    clock.now += 10  # at start every owner counts as just used: what a tier kept from before a restart goes
    assert r.due() == [("acme", IDLE), ("globex", IDLE)]
    r.dropped("acme", IDLE)
    r.dropped("globex", IDLE)
    clock.now += 100
    assert r.due() == []  # nothing used since: nothing to drop
    r.started("acme")
    clock.now += 30
    assert r.due() == []  # a request in flight holds the cache in use, however long
    r.finished("acme")
    r.started("globex")
    r.finished("globex")
    clock.now += 9
    assert r.due() == []
    clock.now += 1
    assert r.due() == [("acme", IDLE), ("globex", IDLE)]
    r.dropped("acme", IDLE)
    assert r.due() == [("globex", IDLE)]  # acme: nothing cached since its drop
    clock.now += 100
    assert ("acme", IDLE) not in r.due()
    r.started("acme")  # used again: its clock restarts
    r.finished("acme")
    clock.now += 5
    assert ("acme", IDLE) not in r.due()
    assert r.state("acme") == {"cache_ttl_seconds": 10, "cache_max_age_seconds": None, "asked_ttl_seconds": None,
                               "expired_idle": 2, "expired_max_age": 0}  # fmt: skip


def test_max_age_drops_whatever_the_traffic() -> None:
    clock = Clock()
    r = Retention({"acme": Policy(max_age_s=60)}, clock)
    r.dropped("acme", MAX_AGE)  # the start's seed taken away: the lifetime below starts at the first request
    for _ in range(12):  # a request every 5 s, one always in flight
        r.started("acme")
        clock.now += 5
        r.finished("acme")
    r.started("acme")
    assert r.due() == [("acme", MAX_AGE)]
    r.dropped("acme", MAX_AGE)
    assert r.due() == []  # the running request's entries start the next lifetime now
    clock.now += 60
    assert r.due() == [("acme", MAX_AGE)]


def test_owners_without_limits_are_not_tracked() -> None:
    clock = Clock()
    r = Retention({"acme": Policy(ttl_s=1)}, clock)
    r.started("globex")
    r.finished("globex")
    r.finished("acme")  # an end without a start (never negative)
    clock.now += 5
    assert r.due() == [("acme", IDLE)] and r.state("globex")["cache_ttl_seconds"] is None
    assert 0.1 <= r.next_check_s() <= 1.0


def test_tenants_file_limits_defaults_and_groups(tmp_path: Path) -> None:
    made = write_tenants_file(
        tmp_path,
        {
            "acme": {"cache_ttl_seconds": 900},
            "globex": {},
            "initech": {"cache": "group:ops", "cache_ttl_seconds": 60, "cache_max_age_seconds": 3600},
            "hooli": {"cache": "group:ops", "cache_ttl_seconds": 30},
        },
        default_cache_ttl_seconds=7200,
        default_cache_max_age_seconds=86400,
    )
    config = load_tenants_file(made.path)
    assert config.tenants["acme"].cache_ttl_seconds == 900 and config.tenants["globex"].cache_ttl_seconds is None
    assert policies(config) == {
        "acme": Policy(900, 86400),
        "globex": Policy(7200, 86400),  # the file's defaults
        "ops": Policy(30, 3600),  # a group: the strictest of its members
    }
    (tmp_path / "plain").mkdir()
    plain = load_tenants_file(write_tenants_file(tmp_path / "plain", ["acme"]).path)
    assert policies(plain) == {}  # no limits: nothing tracked, nothing dropped


@pytest.mark.parametrize(
    ("fields", "top", "field"),
    [
        ({"cache_ttl_seconds": 0}, {}, "tenants[0].cache_ttl_seconds"),
        ({"cache_max_age_seconds": "1h"}, {}, "tenants[0].cache_max_age_seconds"),
        ({"cache_ttl_seconds": True}, {}, "tenants[0].cache_ttl_seconds"),
        ({}, {"default_cache_ttl_seconds": -5}, "default_cache_ttl_seconds"),
        ({"cache_ttl_secs": 5}, {}, "cache_ttl_secs"),
    ],
)
def test_a_bad_retention_field_is_a_startup_error_naming_it(
    fields: dict, top: dict, field: str, tmp_path: Path
) -> None:
    made = write_tenants_file(tmp_path, {"acme": fields}, **top)
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_tenants_file(made.path)


def test_a_request_may_shorten_its_owners_idle_retention_never_extend_it() -> None:
    clock = Clock()
    r = Retention({"acme": Policy(ttl_s=100, max_age_s=1000)}, clock)
    r.dropped("acme", IDLE)  # start from a dropped cache
    r.shorten("acme", 500)  # longer than configured: changes nothing
    assert r.policy("acme") == Policy(ttl_s=100, max_age_s=1000)
    r.shorten("acme", 5)
    r.shorten("acme", 50)  # a later, longer ask does not undo the shorter one
    assert r.policy("acme") == Policy(ttl_s=5, max_age_s=1000) and r.state("acme")["asked_ttl_seconds"] == 5
    r.started("acme")
    r.finished("acme")
    clock.now += 4
    assert r.due() == []
    clock.now += 1
    assert r.due() == [("acme", IDLE)]
    r.dropped("acme", IDLE)
    assert r.policy("acme") == Policy(ttl_s=100, max_age_s=1000)  # the ask ends with the cache cached under it
    assert r.state("acme")["asked_ttl_seconds"] is None


def test_an_owner_without_limits_is_tracked_once_a_request_asks() -> None:
    clock = Clock()
    r = Retention({}, clock)
    r.started("initech")
    r.finished("initech")
    clock.now += 10_000
    assert r.due() == [] and not r.tracks("initech")  # no limit, nothing asked: kept as long as pressure allows
    r.shorten("initech", 3)
    assert r.tracks("initech") and r.next_check_s() == pytest.approx(0.3)
    r.started("initech")
    clock.now += 10
    assert r.due() == []  # in flight
    r.finished("initech")
    clock.now += 3
    assert r.due() == [("initech", IDLE)]
    r.dropped("initech", IDLE)
    assert not r.tracks("initech") and r.due() == []
