"""The L3 residency index: per-owner quotas prune only the owner's own pages, the overall cap the oldest of all."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_iso.cache.l3_index import L3Index


def fill(index: L3Index, owner: str, names: list[str], ns: str = "n") -> None:
    for name in names:
        victims = index.admit(owner)
        assert victims is not None
        for victim in victims:
            index.remove(victim, pruned=True)
        index.add(name, owner, ns)
        index.check_integrity()


def test_owner_at_its_quota_loses_its_own_oldest_page_only() -> None:
    index = L3Index(None)
    fill(index, "b", ["b1"])  # another owner's page, older than all of a's
    assert index.set_quota("a", 2) == []
    fill(index, "a", ["a1", "a2", "a3"])
    assert index.resident_pages("a") == 2 and "a1" not in index and {"a2", "a3", "b1"} <= {*index.drop_all()}
    assert index.pruned_pages == {"a": 1}
    index.touch("a2")  # a read makes a2 the most recent: a3 goes next
    fill(index, "a", ["a4"])
    assert "a3" not in index and "a2" in index and "b1" in index


def test_overall_cap_prunes_the_oldest_of_anyone() -> None:
    index = L3Index(3)
    fill(index, "a", ["a1"])
    fill(index, "b", ["b1", "b2"])
    fill(index, "b", ["b3"])  # the store is full: a1 is the oldest page of all
    assert index.drop_all() == ["b1", "b2", "b3"] and index.pruned_pages == {"a": 1}


def test_quota_zero_admits_nothing_and_lowering_a_quota_names_the_excess() -> None:
    index = L3Index(None)
    fill(index, "a", ["a1", "a2", "a3"])
    assert index.set_quota("a", 1) == ["a1", "a2"]
    assert index.set_quota("z", 0) == [] and index.admit("z") is None
    assert index.set_quota("a", None) == [] and index.quota("a") is None
    with pytest.raises(ValueError):
        index.set_quota("a", -1)
    with pytest.raises(ValueError):
        L3Index(0)


def test_scopes_and_over_cap() -> None:
    index = L3Index(None)
    fill(index, "a", ["a1"], ns="n1")
    fill(index, "a", ["a2"], ns="n2")
    fill(index, "b", ["b1"], ns="n3")
    assert index.drop_owner("a") == ["a1", "a2"] and index.drop_namespace("n2") == ["a2"]
    index.max_pages = 2  # a start over a smaller cap
    assert index.over_cap() == ["a1"]
    index.remove("missing")  # unknown names are ignored
    index.touch("missing")


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "touch", "quota", "flush"]), st.sampled_from("abc"), st.integers(0, 4)),
        max_size=60,
    ),
    cap=st.none() | st.integers(1, 6),
)
def test_random_ops_keep_caps_and_never_prune_another_owner_for_a_quota(
    ops: list[tuple[str, str, int]], cap: int | None
) -> None:
    index = L3Index(cap)
    counter = 0
    for op, owner, n in ops:
        if op == "add":
            counter += 1
            victims = index.admit(owner)
            if victims is None:
                assert index.quota(owner) == 0
                continue
            quota = index.quota(owner)
            own_before = index.drop_owner(owner)
            if cap is None or len(index) < cap:  # the overall cap is not binding: only the quota chose victims
                assert set(victims) <= set(own_before)
            if quota is not None and len(own_before) >= quota:
                assert own_before[0] in victims  # the owner's least recently used page goes first
            for victim in victims:
                index.remove(victim, pruned=True)
            index.add(f"{owner}{counter}", owner, "ns-" + owner)
        elif op == "touch":
            names = index.drop_owner(owner)
            if names:
                index.touch(names[n % len(names)])
        elif op == "quota":
            for victim in index.set_quota(owner, n if n < 4 else None):
                index.remove(victim, pruned=True)
        else:
            for victim in index.drop_owner(owner):
                index.remove(victim)
        index.check_integrity()
