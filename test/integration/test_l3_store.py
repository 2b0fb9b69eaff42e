"""L3 page files: names reveal nothing, keys come from the verified namespace and the secret, restarts hit.

Real SGLang pools (CPU) and our tenant cache. A "restart" is a new cache with
new pools over the same directory: tenant A's evicted prefix must come back
from the files with exactly its KV (positive control), tenant B must get
nothing, and a new secret, a new model fingerprint or a flush must make the
old files unreachable.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from sglang_iso.integration.host_cache import HostCache, l3_owner_of
from sglang_iso.integration.l3_store import FileL3Store, page_payload
from test.integration.test_host_cache import cached, k_values, store
from test.integration.test_scrub import make

SECRET = b"s" * 32
FINGERPRINT = b"model-1"
TOKENS = list(range(500, 516))


def with_l3(page_size: int, directory: Path, *, secret: bytes = SECRET, fingerprint: bytes = FINGERPRINT) -> tuple:
    cache, allocator, kv = make(page_size)
    cache.host = HostCache(cache, 8 * page_size)
    cache.host.l3 = FileL3Store(directory, secret, fingerprint, cache.host.page_bytes, l3_owner_of(cache.resolver))
    cache.tree.set_spill(cache.host.spill)
    return cache, allocator, kv


def evicted_by_a(page_size: int, directory: Path) -> list[float]:
    """A first server: A's prompt is computed, evicted (host + files); returns its K values."""
    cache, allocator, kv = with_l3(page_size, directory)
    original = k_values(kv, store(cache, allocator, kv, TOKENS, "tenant-a"))
    cache.evict(EvictParams(num_tokens=len(TOKENS)))
    assert cache.host.l3 is not None and cache.host.l3.written_pages == len(TOKENS) // page_size
    return original


@pytest.mark.parametrize("page_size", [1, 4])
def test_restart_hits_from_files_for_the_same_namespace_only(page_size: int, tmp_path: Path) -> None:
    original = evicted_by_a(page_size, tmp_path)
    cache, _, kv = with_l3(page_size, tmp_path)  # "restart": empty device and host, same secret and directory
    assert cached(cache, TOKENS, "tenant-b").device_prefix_len == 0
    hit = cached(cache, TOKENS, "tenant-a")
    assert hit.device_prefix_len == len(TOKENS)  # positive control
    assert k_values(kv, cache.path_device_indices(hit.last_device_node)) == original
    row = cache.tenant_stats()["open"]
    assert row["l3_loaded_tokens"] == len(TOKENS)
    assert cache.check_integrity()


def test_file_names_reveal_nothing(tmp_path: Path) -> None:
    evicted_by_a(4, tmp_path)
    names = [p.name for p in tmp_path.iterdir()]
    pages = [n for n in names if n.endswith(".kv")]
    assert len(pages) == 4
    for name in pages:
        stem = name.removesuffix(".kv")
        assert len(stem) == 64 and all(c in "0123456789abcdef" for c in stem)
    joined = " ".join(names)
    for secret_word in ("tenant", "open", "500", "model", "tmp"):
        assert secret_word not in joined


@pytest.mark.parametrize("change", ["secret", "fingerprint"])
def test_new_secret_or_model_makes_old_files_unreachable(change: str, tmp_path: Path) -> None:
    evicted_by_a(4, tmp_path)
    kwargs = {"secret": b"t" * 32} if change == "secret" else {"fingerprint": b"model-2"}
    cache, _, _ = with_l3(4, tmp_path, **kwargs)
    assert cached(cache, TOKENS, "tenant-a").device_prefix_len == 0
    control, _, _ = with_l3(4, tmp_path)
    assert cached(control, TOKENS, "tenant-a").device_prefix_len == len(TOKENS)


def test_flush_makes_files_unreachable_across_restarts(tmp_path: Path) -> None:
    evicted_by_a(4, tmp_path)
    cache, _, _ = with_l3(4, tmp_path)
    cache.flush_owner("*")
    assert cached(cache, TOKENS, "tenant-a").device_prefix_len == 0
    again, _, _ = with_l3(4, tmp_path)
    assert cached(again, TOKENS, "tenant-a").device_prefix_len == 0


def test_tampered_file_is_a_counted_miss(tmp_path: Path) -> None:
    evicted_by_a(4, tmp_path)
    first = sorted(tmp_path.glob("*.kv"))
    for path in first:
        data = bytearray(path.read_bytes())
        data[0] ^= 0xFF
        path.write_bytes(bytes(data))
    cache, _, _ = with_l3(4, tmp_path)
    assert cached(cache, TOKENS, "tenant-a").device_prefix_len == 0
    assert cache.host.l3.bad_files >= 1


def test_store_contract(tmp_path: Path) -> None:
    st = FileL3Store(tmp_path, SECRET, FINGERPRINT, 8)
    assert st.write("ns-a", b"d1", b"12345678") and st.read("ns-a", b"d1") == b"12345678"
    assert st.read("ns-b", b"d1") is None
    with pytest.raises(ValueError):
        st.write("ns-a", b"d2", b"short")
    with pytest.raises(ValueError):
        FileL3Store(tmp_path, b"", FINGERPRINT, 8)
    (tmp_path / st._epochs_path.name).write_text("not json")
    with pytest.raises(RuntimeError, match="epochs"):
        FileL3Store(tmp_path, SECRET, FINGERPRINT, 8)


def test_tenant_flush_covers_namespaces_not_seen_since_restart(tmp_path: Path) -> None:
    def owner(ns: str) -> str:
        return ns.split(":")[1]

    first = FileL3Store(tmp_path, SECRET, FINGERPRINT, 4, owner)
    for ns in ("t:acme:1", "t:acme:2", "t:globex:1"):
        assert first.write(ns, b"d", b"kvkv")
    FileL3Store(tmp_path, SECRET, FINGERPRINT, 4, owner).flush("owner:acme")  # a restart, then an admin flush
    later = FileL3Store(tmp_path, SECRET, FINGERPRINT, 4, owner)
    assert later.read("t:acme:1", b"d") is None and later.read("t:acme:2", b"d") is None
    assert later.read("t:globex:1", b"d") == b"kvkv"  # control: another tenant keeps its pages


def test_reset_and_clear_storage_make_files_unreachable(tmp_path: Path) -> None:
    # /flush_cache and weight updates reset the cache: KV computed before must not come back from the files.
    for action in ("reset", "clear_storage_backend"):
        evicted_by_a(4, tmp_path)
        cache, _, _ = with_l3(4, tmp_path)
        getattr(cache, action)()
        assert cached(cache, TOKENS, "tenant-a").device_prefix_len == 0, action


def test_concurrent_flushes_from_two_ranks_are_both_kept(tmp_path: Path) -> None:
    rank0 = FileL3Store(tmp_path, SECRET, FINGERPRINT, 4)
    rank1 = FileL3Store(tmp_path, SECRET, FINGERPRINT, 4)  # another process over the same directory
    for ns in ("ns-a", "ns-b"):
        assert rank0.write(ns, b"d", b"kvkv")
    rank0.flush("ns:ns-a")
    rank1.flush("ns:ns-b")  # must not write back its stale view without ns-a's bump
    after = FileL3Store(tmp_path, SECRET, FINGERPRINT, 4)
    assert after.read("ns-a", b"d") is None and after.read("ns-b", b"d") is None


def test_factory_attaches_the_store_or_refuses_clearly(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from sglang_iso.coverage import NotCoveredError
    from sglang_iso.integration.backend import _attach_host_tier
    from sglang_iso.server.hicache_args import L3_DIR_ENV
    from sglang_iso.settings import Settings

    def l3_at(path: Path | None) -> Settings:
        return Settings.from_env({} if path is None else {L3_DIR_ENV: str(path)})

    ctx = SimpleNamespace(
        server_args=SimpleNamespace(hicache_ratio=2.0, hicache_size=0, model_path=str(tmp_path)), tp_rank=0, tp_size=1
    )
    cache, _, _ = make(4)
    _attach_host_tier(cache, ctx, l3_at(None), SECRET)  # type: ignore[arg-type]
    assert cache.host is not None and cache.host.l3 is None and cache.host.logical_size == 2 * 64
    with pytest.raises(NotCoveredError, match="needs --tenants-file"):
        _attach_host_tier(make(4)[0], ctx, l3_at(tmp_path / "l3"), None)  # type: ignore[arg-type]
    (tmp_path / "blocked").write_text("a file, not a directory")
    with pytest.raises(NotCoveredError, match="not usable"):
        _attach_host_tier(make(4)[0], ctx, l3_at(tmp_path / "blocked" / "l3"), SECRET)  # type: ignore[arg-type]
    ok, _, _ = make(4)
    _attach_host_tier(ok, ctx, l3_at(tmp_path / "l3"), SECRET)  # type: ignore[arg-type]
    assert ok.host is not None and ok.host.l3 is not None and (tmp_path / "l3").is_dir()


def _owner(ns: str) -> str:
    return ns.split(":")[1]


def test_owner_over_its_l3_quota_loses_its_own_oldest_files_only(tmp_path: Path) -> None:
    st = FileL3Store(tmp_path, SECRET, FINGERPRINT, 4, _owner)
    assert st.write("t:globex:1", b"g", b"gggg")  # globex's file is the oldest of all
    assert st.set_quota("acme", 2) == 0
    for digest in (b"d1", b"d2", b"d3"):
        assert st.write("t:acme:1", digest, b"kvkv")
    assert st.read("t:acme:1", b"d1") is None  # acme's oldest went
    assert st.read("t:acme:1", b"d2") == b"kvkv" and st.read("t:acme:1", b"d3") == b"kvkv"
    assert st.read("t:globex:1", b"g") == b"gggg"  # never another tenant's
    assert st.owner_stats("acme") == {"l3_resident_pages": 2, "l3_pruned_pages": 1}
    assert len(list(tmp_path.glob("*.kv"))) == 3
    st.set_quota("acme", 1)  # lowering the quota deletes at once
    assert st.owner_stats("acme")["l3_resident_pages"] == 1 and len(list(tmp_path.glob("*.kv"))) == 2
    st.set_quota("globex", 0)
    assert not st.write("t:globex:1", b"g2", b"gggg")  # quota 0: nothing stored, not an error
    st.index.check_integrity()


def test_overall_cap_deletes_the_least_recently_used_files_across_restarts(tmp_path: Path) -> None:
    probe = FileL3Store(tmp_path / "probe", SECRET, FINGERPRINT, 4)
    cap = 3 * probe.file_bytes
    st = FileL3Store(tmp_path, SECRET, FINGERPRINT, 4, _owner, max_bytes=cap)
    for digest in (b"d1", b"d2", b"d3"):
        assert st.write("t:acme:1", digest, b"kvkv")
    assert st.read("t:acme:1", b"d1") == b"kvkv"  # d1 is now the most recent
    assert st.write("t:globex:1", b"g", b"gggg")  # full: the least recently used file of anyone (d2) goes
    assert st.read("t:acme:1", b"d2") is None and st.read("t:acme:1", b"d1") == b"kvkv"
    assert st.status()["l3_pruned_pages"] == 1 and st.status()["l3_resident_pages"] == 3
    smaller = FileL3Store(tmp_path, SECRET, FINGERPRINT, 4, _owner, max_bytes=2 * probe.file_bytes)  # a restart
    assert len(smaller.index) == 2 and len(list(tmp_path.glob("*.kv"))) == 2
    with pytest.raises(ValueError, match="smaller than one page file"):
        FileL3Store(tmp_path, SECRET, FINGERPRINT, 4, max_bytes=10)


def test_flush_deletes_the_flushed_files_and_a_restart_removes_stale_ones(tmp_path: Path) -> None:
    st = FileL3Store(tmp_path, SECRET, FINGERPRINT, 4, _owner)
    for ns in ("t:acme:1", "t:acme:2", "t:globex:1"):
        assert st.write(ns, b"d", b"kvkv")
    assert st.flush("owner:acme") == 2  # both of acme's namespaces, deleted now
    assert len(list(tmp_path.glob("*.kv"))) == 1 and st.read("t:globex:1", b"d") == b"kvkv"
    # A file written by another process under the old epoch is unreachable and removed at the next start.
    other = FileL3Store(tmp_path, SECRET, FINGERPRINT, 4, _owner)
    assert other.write("t:globex:1", b"x", b"xxxx")
    other.flush("ns:t:globex:1")
    st.write("t:globex:1", b"y", b"yyyy")  # st's view of the epochs is older: its name is stale too
    restarted = FileL3Store(tmp_path, SECRET, FINGERPRINT, 4, _owner)
    assert restarted.stale_removed == 1 and len(restarted.index) == 0
    assert list(tmp_path.glob("*.kv")) == []


def test_files_of_another_secret_are_never_counted_or_deleted(tmp_path: Path) -> None:
    old = FileL3Store(tmp_path, b"o" * 32, FINGERPRINT, 4, _owner)
    assert old.write("t:acme:1", b"d", b"kvkv")
    probe = FileL3Store(tmp_path / "probe", SECRET, FINGERPRINT, 4)
    new = FileL3Store(tmp_path, SECRET, FINGERPRINT, 4, _owner, max_bytes=probe.file_bytes)
    assert new.foreign_files == 1 and len(new.index) == 0
    assert new.write("t:acme:1", b"e", b"kvkv") and new.write("t:acme:1", b"f", b"kvkv")
    assert len(list(tmp_path.glob("*.kv"))) == 2  # the old secret's file stays (the operator removes it)
    assert new.flush("*") == 1 and len(list(tmp_path.glob("*.kv"))) == 1


def test_tenant_l3_quota_is_enforced_reported_and_flushed(tmp_path: Path) -> None:
    from sglang_iso.identity.tags import NamespaceResolver, make_tag
    from sglang_iso.integration.tenant_cache import TenantPolicy, TenantRadixCache
    from test.integration.test_host_cache import _params

    base, allocator, kv = make(4)
    secret = b"k" * 32
    resolver = NamespaceResolver(secret)
    policies = {
        "acme": TenantPolicy(None, "private", host_quota_tokens=4, l3_quota_tokens=8),
        "globex": TenantPolicy(None, "private"),
    }
    cache = TenantRadixCache(_params(base), resolver, policies)
    cache.host = HostCache(cache, 64)
    cache.host.l3 = FileL3Store(tmp_path, secret, FINGERPRINT, cache.host.page_bytes, l3_owner_of(resolver))
    cache.tree.set_spill(cache.host.spill)
    for owner, settings in policies.items():
        cache.host.set_l3_quota(owner, settings.l3_quota_tokens)
    acme, globex = make_tag(secret, "acme", "a" * 64), make_tag(secret, "globex", "b" * 64)
    store(cache, allocator, kv, list(range(900, 908)), globex)
    cache.evict(EvictParams(num_tokens=8))
    for start in (100, 200):  # 16 of acme's tokens go to L3: its 8-token quota keeps the newest 8
        store(cache, allocator, kv, list(range(start, start + 8)), acme)
        cache.evict(EvictParams(num_tokens=8))
    rows = cache.tenant_stats()
    assert rows["acme"]["l3_resident_tokens"] == 8 and rows["acme"]["l3_pruned_tokens"] == 8, rows
    assert rows["acme"]["l3_quota_tokens"] == 8 and rows["acme"]["host_quota_tokens"] == 4
    assert rows["acme"]["host_resident_tokens"] == 4  # the host quota covers all of acme's namespaces
    assert rows["globex"]["l3_resident_tokens"] == 8 and rows["globex"]["l3_pruned_tokens"] == 0
    assert rows["globex"]["l3_quota_tokens"] is None
    assert cached(cache, list(range(900, 908)), globex).device_prefix_len == 8  # control: globex hits
    cache.flush_owner("acme")  # acme's files are deleted, globex's stay
    assert cache.tenant_stats()["acme"]["l3_resident_tokens"] == 0
    assert cached(cache, list(range(200, 208)), acme).device_prefix_len == 0
    assert len(list(tmp_path.glob("*.kv"))) == 2


def test_report_exports_tier_residency_per_tenant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang_iso import observability
    from sglang_iso_testing.fake_metrics import RecordedMetrics

    recorded = RecordedMetrics()
    calls = recorded.calls
    monkeypatch.setattr(observability, "metrics", lambda: recorded)
    cache, allocator, kv = with_l3(4, tmp_path)
    store(cache, allocator, kv, TOKENS, "tenant-a")
    cache.evict(EvictParams(num_tokens=len(TOKENS)))
    cache.report.maybe_export(min_interval_s=0)
    assert calls[("l3_resident_tokens", (("tenant", "open"),))][-1] == ("set", len(TOKENS))
    assert calls[("host_resident_tokens", (("tenant", "open"),))][-1] == ("set", len(TOKENS))
    assert ("tier_quota_tokens", (("tenant", "open"), ("tier", "l3"))) in calls


def test_shared_prefix_returns_from_files_after_a_restart(tmp_path: Path) -> None:
    from sglang_iso.integration.host_cache import SHARED_L3_OWNER
    from sglang_iso.integration.shared_prefixes import SCOPE

    head = TOKENS[:8]
    cache, allocator, kv = with_l3(4, tmp_path)
    cache.tree.declare_shared("sys", head, frozenset({"open"}), scope=SCOPE)  # open mode: every namespace reads
    original = k_values(kv, store(cache, allocator, kv, TOKENS, "tenant-a"))
    cache.evict(EvictParams(num_tokens=len(TOKENS)))
    assert cache.host.l3 is not None
    assert cache.host.l3.owner_stats(SHARED_L3_OWNER)["l3_resident_pages"] == 2  # its own owner, no tenant's
    cache.flush_owner("open")  # a tenant flush leaves the operator's prefix alone
    assert cache.host.l3.owner_stats(SHARED_L3_OWNER)["l3_resident_pages"] == 2

    again, _, kv2 = with_l3(4, tmp_path)  # restart: empty device and host
    again.tree.declare_shared("sys", head, frozenset({"open"}), scope=SCOPE)
    hit = cached(again, [*head, 7, 7, 7, 7], "tenant-b")  # another reader: the prefix, from the files
    assert hit.device_prefix_len == len(head)
    assert k_values(kv2, again.path_device_indices(hit.last_device_node)) == original[: len(head)]
    assert again.check_integrity()


POISON = bytes(range(7, 71))  # 64 bytes, no run of equal bytes: any 16 of them in a row is a tell


def _poisoned_evicted_by_a(directory: Path) -> tuple[list[float], bytes]:
    """A first server whose tenant A's KV is a known byte pattern, evicted to the files."""
    cache, allocator, kv = with_l3(4, directory)
    slots = store(cache, allocator, kv, TOKENS, "tenant-a")
    pattern = (POISON * (1 + kv.k_buffer[0][0].numel() * 4 // len(POISON)))[: kv.k_buffer[0][0].numel() * 4]
    for buf in [*kv.k_buffer, *kv.v_buffer]:
        row = torch.frombuffer(bytearray(pattern[: buf[0].numel() * buf.element_size()]), dtype=torch.uint8)
        buf.view(torch.uint8).view(buf.shape[0], -1)[slots.long()] = row
    original = k_values(kv, slots)
    plain = page_payload([*kv.k_buffer, *kv.v_buffer], slots[:4].long())
    assert pattern[:16] in plain  # control: the detector finds the pattern in a page's plaintext
    cache.evict(EvictParams(num_tokens=len(TOKENS)))
    assert cache.host.l3 is not None and cache.host.l3.written_pages == len(TOKENS) // 4
    return original, pattern


def test_files_hold_no_plaintext_kv_and_the_owner_still_hits(tmp_path: Path) -> None:
    """Encryption at rest: a known pattern in A's KV is in no file byte (no 16-byte run of it), while A's restart
    hit returns exactly that KV (positive control)."""
    original, pattern = _poisoned_evicted_by_a(tmp_path)
    assert len(pattern) >= 16
    windows = {pattern[i : i + 16] for i in range(len(pattern) - 15)}
    files = list(tmp_path.glob("*.kv"))
    assert len(files) == len(TOKENS) // 4
    for path in files:
        data = path.read_bytes()
        assert not any(w in data for w in windows), path.name
    cache, _, kv = with_l3(4, tmp_path)
    hit = cached(cache, TOKENS, "tenant-a")
    assert hit.device_prefix_len == len(TOKENS)
    assert k_values(kv, cache.path_device_indices(hit.last_device_node)) == original


def test_a_file_moved_to_another_tenants_name_is_a_counted_miss(tmp_path: Path) -> None:
    """Names, headers and keys are per tenant: B's file copied over A's name (or A's over B's) decrypts for
    nobody; each keeps reading its own (control)."""
    st = FileL3Store(tmp_path, SECRET, FINGERPRINT, 8, _owner)
    assert st.write("t:acme:1", b"d", b"acme-kv!") and st.write("t:globex:1", b"d", b"globexkv")
    a, b = tmp_path / st.name("t:acme:1", b"d"), tmp_path / st.name("t:globex:1", b"d")
    assert a.read_bytes()[-24:] != b.read_bytes()[-24:]
    a_bytes = a.read_bytes()
    a.write_bytes(b.read_bytes())
    assert st.read("t:acme:1", b"d") is None and st.bad_files == 1
    assert st.read("t:globex:1", b"d") == b"globexkv"  # control
    a.write_bytes(a_bytes)
    assert st.read("t:acme:1", b"d") == b"acme-kv!"  # control: the right file is read again
    for offset in (-1, -20, -30):  # the tag, the ciphertext, the nonce
        flipped = bytearray(a_bytes)
        flipped[offset] ^= 0x01
        a.write_bytes(bytes(flipped))
        assert st.read("t:acme:1", b"d") is None
    assert st.bad_files == 4


def test_a_flush_changes_the_tenants_key(tmp_path: Path) -> None:
    """After a tenant flush its old file, put back under the new name, does not decrypt (new epoch, new key)."""
    st = FileL3Store(tmp_path, SECRET, FINGERPRINT, 8, _owner)
    assert st.write("t:acme:1", b"d", b"acme-kv!")
    old = (tmp_path / st.name("t:acme:1", b"d")).read_bytes()
    st.flush("owner:acme")
    (tmp_path / st.name("t:acme:1", b"d")).write_bytes(old)
    assert st.read("t:acme:1", b"d") is None and st.bad_files == 1
    assert st.write("t:acme:1", b"d2", b"acme-kv2") and st.read("t:acme:1", b"d2") == b"acme-kv2"  # control


def test_erase_drops_every_tier_and_its_receipt_counts_what_each_held(tmp_path: Path) -> None:
    """An erase of acme: device entries (one held by a running request), host pages and L3 files, each counted in
    the receipt; the freed device pages are zero at once; globex keeps everything (control)."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

    from sglang_iso.identity.tags import NamespaceResolver, make_tag
    from sglang_iso.integration.scrub import KvScrubber
    from sglang_iso.integration.tenant_cache import TenantPolicy, TenantRadixCache
    from test.integration.test_host_cache import _params
    from test.integration.test_host_cache import key as tree_key

    base, allocator, kv = make(4)
    secret = b"k" * 32
    resolver = NamespaceResolver(secret)
    cache = TenantRadixCache(_params(base), resolver, {o: TenantPolicy(None, "private") for o in ("acme", "globex")})
    cache.scrubber = base.scrubber  # the allocator's scrub-on-free (installed by ``make``)
    assert isinstance(cache.scrubber, KvScrubber)
    cache.host = HostCache(cache, 64)
    cache.host.l3 = FileL3Store(tmp_path, secret, FINGERPRINT, cache.host.page_bytes, l3_owner_of(resolver))
    cache.tree.set_spill(cache.host.spill)
    acme, globex = make_tag(secret, "acme", "a" * 64), make_tag(secret, "globex", "b" * 64)
    for tag in (acme, globex):  # 8 tokens each spilled to host and L3
        store(cache, allocator, kv, list(range(300, 308)), tag)
    cache.evict(EvictParams(num_tokens=16))
    dropped = store(cache, allocator, kv, list(range(400, 408)), acme)  # on the device, unlocked
    store(cache, allocator, kv, list(range(500, 504)), acme)
    held = cache.match_prefix(MatchPrefixParams(key=tree_key(list(range(500, 504)), acme)))
    cache.inc_lock_ref(held.last_device_node)  # a running request holds these 4 tokens
    for buf in [*kv.k_buffer, *kv.v_buffer]:
        buf[dropped.long()] = 7.0
    host_before = cache.tenant_stats()["acme"]["host_resident_tokens"]
    assert host_before == 8 and len(list(tmp_path.glob("*.kv"))) == 4

    receipt = cache.erase_owner("acme")
    assert receipt == {
        "device_tokens_dropped": 8,
        "device_pages_scrubbed": receipt["device_pages_scrubbed"],
        "device_tokens_held": 4,
        "host_tokens_dropped": 8,
        "l3_files_deleted": 2,
        "pd_pages_fenced": 0,
    }, receipt
    assert receipt["device_pages_scrubbed"] >= 2  # the dropped 8 tokens' pages, zeroed now, not at a later hand-out
    for buf in [*kv.k_buffer, *kv.v_buffer]:
        assert int(torch.count_nonzero(buf[dropped.long()])) == 0
    assert cached(cache, list(range(300, 308)), acme).device_prefix_len == 0
    assert cached(cache, list(range(400, 408)), acme).device_prefix_len == 0
    assert cached(cache, list(range(300, 308)), globex).device_prefix_len == 8  # control: globex untouched
    assert len(list(tmp_path.glob("*.kv"))) == 2
    cache.dec_lock_ref(held.last_device_node)
    assert cache.erase_owner("acme")["device_tokens_dropped"] == 4  # the held entries go once released
    assert cache.check_integrity()


def test_a_flushed_tenants_files_cannot_be_decrypted_even_with_the_secret(tmp_path: Path) -> None:
    """Crypto-shredding: a copy of acme's file (a backup, another node) is readable with the secret and the epochs
    file of its time (control), and not with the epochs file after acme's flush, even put back under its old
    name with acme's epoch rewound: the salt of that epoch is gone."""
    import json

    st = FileL3Store(tmp_path / "live", SECRET, FINGERPRINT, 8, _owner)
    assert st.write("t:acme:1", b"d", b"acme-kv!")
    name = st.name("t:acme:1", b"d")
    backup = (tmp_path / "live" / name).read_bytes()
    epochs_name = st._epochs_path.name
    before = (tmp_path / "live" / epochs_name).read_text()

    def restored(epochs_text: str) -> FileL3Store:
        where = tmp_path / f"restore-{len(list(tmp_path.iterdir()))}"
        where.mkdir()
        (where / name).write_bytes(backup)
        (where / epochs_name).write_text(epochs_text)
        return FileL3Store(where, SECRET, FINGERPRINT, 8, _owner)

    assert restored(before).read("t:acme:1", b"d") == b"acme-kv!"  # control: the old salt decrypts it
    st.flush("owner:acme")
    after = json.loads((tmp_path / "live" / epochs_name).read_text())
    acme = st.owner_label("t:acme:1")
    rewound = {**after, acme: [0, after[acme][1]]}  # the old name again, but only the new salt exists
    attacker = restored(json.dumps(rewound))
    assert attacker.name("t:acme:1", b"d") == name
    assert attacker.read("t:acme:1", b"d") is None and attacker.bad_files == 1
    assert st.write("t:acme:1", b"d", b"acme-kv2") and st.read("t:acme:1", b"d") == b"acme-kv2"  # control


def test_erasing_a_reader_of_a_shared_prefix_drops_its_continuations_and_keeps_the_operators_prefix(
    tmp_path: Path,
) -> None:
    """acme and globex read the operator's prefix ``sys``: erasing acme drops acme's continuations in every tier
    (device, host, L3) and pins nothing: the shared prefix is the operator's, and globex (and acme, anew) still
    read it; globex's own continuation stays (control)."""
    from sglang_iso.identity.tags import NamespaceResolver, make_tag
    from sglang_iso.integration.host_cache import SHARED_L3_OWNER
    from sglang_iso.integration.shared_prefixes import SCOPE
    from sglang_iso.integration.tenant_cache import TenantPolicy, TenantRadixCache
    from test.integration.test_host_cache import _params

    base, allocator, kv = make(4)
    secret = b"k" * 32
    resolver = NamespaceResolver(secret)
    cache = TenantRadixCache(_params(base), resolver, {o: TenantPolicy(None, "private") for o in ("acme", "globex")})
    cache.scrubber = base.scrubber
    cache.host = HostCache(cache, 64)
    cache.host.l3 = FileL3Store(tmp_path, secret, FINGERPRINT, cache.host.page_bytes, l3_owner_of(resolver))
    cache.tree.set_spill(cache.host.spill)
    head = list(range(600, 608))
    cache.tree.declare_shared("sys", head, frozenset({"acme", "globex"}), scope=SCOPE)
    acme, globex = make_tag(secret, "acme", "a" * 64), make_tag(secret, "globex", "b" * 64)
    acme_tail, globex_tail = [*head, 11, 12, 13, 14], [*head, 21, 22, 23, 24]
    store(cache, allocator, kv, acme_tail, acme)
    store(cache, allocator, kv, globex_tail, globex)
    cache.evict(EvictParams(num_tokens=16))  # all of it to host and L3
    assert cached(cache, acme_tail, acme).device_prefix_len == len(acme_tail)  # positive control, from host
    cache.evict(EvictParams(num_tokens=16))
    assert cache.host.l3 is not None
    shared_pages = cache.host.l3.owner_stats(SHARED_L3_OWNER)["l3_resident_pages"]
    assert shared_pages == 2 and cache.tenant_stats()["acme"]["host_resident_tokens"] == 4

    receipt = cache.erase_owner("acme")
    assert receipt["host_tokens_dropped"] == 4 and receipt["l3_files_deleted"] == 1, receipt
    assert receipt["device_tokens_held"] == 0
    assert cache.tenant_stats()["acme"]["host_resident_tokens"] == 0
    assert cache.host.l3.owner_stats(SHARED_L3_OWNER)["l3_resident_pages"] == shared_pages  # the operator's prefix
    assert cached(cache, acme_tail, acme).device_prefix_len == len(head)  # acme: the prefix, not its continuation
    assert cached(cache, globex_tail, globex).device_prefix_len == len(globex_tail)  # control: globex keeps its own
    assert cache.check_integrity()
