"""The evidence report: each check passes on good inputs and fails on the input that breaks it; no secret leaks."""

from __future__ import annotations

import copy
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from sglang_iso.audit import evidence
from sglang_iso.tenancy.config import load_tenants_file
from sglang_iso_testing.tenants import TenantsFile, write_tenants_file


@pytest.fixture
def made(tmp_path: Path) -> TenantsFile:
    return write_tenants_file(tmp_path, {"acme": {"cache_ttl_seconds": 900}, "globex": {"cache_max_age_seconds": 60}})


def _rank() -> dict[str, Any]:
    tree = {"is_tenant": True, "impl": "TenantRadixCache", "namespace_mode": "tenants", "rejected_tags": 0,
            "violations": 0, "kv_scrub": "on-free", "scrubbed_pages": 40, "kv_owner_check": "on",
            "owner_violations": 0}  # fmt: skip
    return {"tree_cache": tree}


def _server() -> dict[str, Any]:
    served = {"requests": 3, "prompt_tokens": 300, "cached_tokens": 120}
    tenants = {"tenants": {"acme": {"served": served}, "globex": {"served": served}}, "unverified_tags": [0]}
    return {"base_url": "http://x", "ranks": [_rank()], "tenants": tenants, "check": {"integrity_ok": True}}


def _audit(other_detected: bool = False, control_detected: bool = True) -> dict[str, Any]:
    def scope(name: str, detected: bool) -> dict[str, Any]:
        verdict = "sharing detected" if detected else "no sharing detected"
        return {"scope": name, "detected": detected, "p_value": 0.001 if detected else 0.6, "verdict": verdict,
                "oracle": {"detected": detected}}  # fmt: skip

    return {"results": [scope("same-key", control_detected), scope("other-tenant", other_detected)]}


FUZZ = {"seed": 1, "requests": 500, "leaks": 0, "errors": 0, "same_owner_hits": 80}


def _statuses(made: TenantsFile, **inputs: Any) -> dict[str, str]:
    args = {"server": _server(), "audit": _audit(), "fuzz": dict(FUZZ), **inputs}
    report = evidence.build(load_tenants_file(made.path), **args)
    return {c["id"]: c["status"] for c in report["checks"]}


def test_every_check_passes_on_a_good_deployment(made: TenantsFile) -> None:
    assert _statuses(made) == dict.fromkeys(("E1", "E2", "E3", "E4", "E5", "E6"), "pass")


def _broken(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    server = _server()
    target: Any = server
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return server


@pytest.mark.parametrize(
    ("inputs", "failing"),
    [
        ({"server": _broken(("ranks", 0, "tree_cache", "rejected_tags"), 2)}, {"E1"}),
        ({"server": _broken(("ranks", 0, "tree_cache", "namespace_mode"), "open")}, {"E1"}),
        ({"server": _broken(("ranks", 0, "tree_cache", "kv_scrub"), "off")}, {"E2"}),
        ({"server": _broken(("ranks", 0, "tree_cache", "kv_owner_check"), "off")}, {"E2"}),
        ({"server": _broken(("tenants", "unverified_tags"), [1])}, {"E3"}),
        ({"server": _broken(("check", "integrity_ok"), False)}, {"E5"}),
        ({"audit": _audit(other_detected=True)}, {"E1", "E4"}),
        ({"audit": _audit(control_detected=False)}, {"E4"}),  # a control that shows nothing proves nothing
        ({"fuzz": {**FUZZ, "leaks": 1}}, {"E1", "E4"}),
        ({"fuzz": {**FUZZ, "same_owner_hits": 0}}, {"E4"}),
    ],
)
def test_each_failure_fails_its_check_and_only_its(made: TenantsFile, inputs: dict, failing: set[str]) -> None:
    statuses = _statuses(made, **copy.deepcopy(inputs))
    assert {k for k, v in statuses.items() if v == "fail"} == failing, statuses


def test_missing_inputs_are_not_shown_and_unset_retention_is_not_configured(tmp_path: Path) -> None:
    made = write_tenants_file(tmp_path, ["acme", "globex"])
    report = evidence.build(load_tenants_file(made.path))
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert statuses == {"E1": "not shown", "E2": "not shown", "E3": "not shown", "E4": "not shown",
                        "E5": "not shown", "E6": "not configured"}  # fmt: skip


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows = 0
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.rows += tag == "tr"

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_cli_writes_three_formats_without_any_secret(made: TenantsFile, tmp_path: Path) -> None:
    audit, fuzz = tmp_path / "audit.json", tmp_path / "fuzz.json"
    audit.write_text(json.dumps(_audit()))
    fuzz.write_text(json.dumps(FUZZ))
    out = tmp_path / "out"
    argv = ["--tenants-file", str(made.path), "--audit-json", str(audit), "--leak-fuzz-json", str(fuzz)]
    assert evidence.main([*argv, "--out-dir", str(out)]) == 0  # no check failed (the server's are not shown)
    texts = {name: (out / f"evidence.{name}").read_text() for name in ("json", "md", "html")}
    config = load_tenants_file(made.path)
    for text in texts.values():
        assert config.secret.hex() not in text
        for tenant in config.tenants.values():
            assert not any(h in text for h in tenant.key_hashes)
    parsed = _Cells()
    parsed.feed(texts["html"])
    assert parsed.rows >= 1 + 6 + 1 + 2  # header and 6 checks, header and 2 tenants
    assert "| AISVS 5.6.1 | L2 |" in texts["md"] and "acme" in "".join(parsed.text)
    bad = tmp_path / "fuzz-bad.json"
    bad.write_text(json.dumps({**FUZZ, "leaks": 3}))
    assert evidence.main([*argv[:4], "--leak-fuzz-json", str(bad), "--out-dir", str(out)]) == 1
    assert evidence.main(["--tenants-file", str(tmp_path / "missing.toml")]) == 2


def test_a_control_takes_the_worst_status_of_its_checks(made: TenantsFile) -> None:
    good = evidence.build(load_tenants_file(made.path), server=_server(), audit=_audit(), fuzz=dict(FUZZ))
    assert {c["id"]: c["status"] for c in good["controls"]} == dict.fromkeys(
        ("AISVS 5.6.1", "AISVS 5.6.2", "AISVS 4.7.4", "AISVS 12.2.1"), "pass"
    )
    scrub_off = _broken(("ranks", 0, "tree_cache", "kv_scrub"), "off")  # fails E2: 5.6.2 and 4.7.4 list it
    bad = evidence.build(load_tenants_file(made.path), server=scrub_off, audit=_audit(), fuzz=dict(FUZZ))
    failing = {c["id"] for c in bad["controls"] if c["status"] == "fail"}
    assert failing == {"AISVS 5.6.2", "AISVS 4.7.4"}
    bare = evidence.build(load_tenants_file(made.path))  # no server or test result: not shown, never pass
    statuses = {c["id"]: c["status"] for c in bare["controls"]}
    assert statuses.pop("AISVS 12.2.1") == "pass"  # shown by the tenants file alone: every tenant has a retention
    assert set(statuses.values()) == {"not shown"}
    for check in bad["checks"]:  # each check names the controls that list it
        listed = {f"OWASP {c.id} (L{c.level})" for c in evidence.CONTROLS if check["id"] in c.checks}
        assert listed <= set(check["sources"]), check


BROWSER = evidence.find_browser()


@pytest.mark.skipif(BROWSER is None, reason="no headless Chromium (apt-get install chromium; scripts/install.sh)")
def test_the_page_renders_in_a_headless_browser_and_prints_to_pdf(made: TenantsFile, tmp_path: Path) -> None:
    import pypdf

    assert BROWSER is not None
    out = tmp_path / "out"
    bad = tmp_path / "fuzz.json"
    bad.write_text(json.dumps({**FUZZ, "leaks": 2}))
    argv = ["--tenants-file", str(made.path), "--leak-fuzz-json", str(bad), "--out-dir", str(out), "--pdf"]
    assert evidence.main(argv) == 1  # a leak fails E1
    report = json.loads((out / "evidence.json").read_text())
    dom = _Rows()
    dom.feed(evidence.rendered_dom(BROWSER, out / "evidence.html"))  # the page as the browser built it
    assert dom.rows["checks"] == [(c["id"], c["status"]) for c in report["checks"]]
    assert dom.rows["controls"] == [(c["id"], c["status"]) for c in report["controls"]]
    assert ("E1", "fail") in dom.rows["checks"]
    pages = pypdf.PdfReader(out / "evidence.pdf").pages
    text = " ".join(page.extract_text() for page in pages)
    for needle in ("sglang-iso evidence report", "AISVS 5.6.1", "acme", "globex", "2 leaks"):
        assert needle in text, needle
    config = load_tenants_file(made.path)
    assert config.secret.hex() not in text
    assert evidence.main([*argv[:-1], "--pdf", "--browser", str(tmp_path / "no-such-browser")]) == 2


class _Rows(HTMLParser):
    """(first cell, status cell) of each body row of the tables ``checks`` and ``controls``."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[tuple[str, str]]] = {"checks": [], "controls": []}
        self._table: str | None = None
        self._cells: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._table = dict(attrs).get("id")
        elif tag == "tr" and self._table in self.rows:
            self._cells = []
        elif tag == "td" and self._cells is not None:
            self._cells.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr" and self._table in self.rows and self._cells:
            status = self._cells[3] if self._table == "checks" else self._cells[4]
            self.rows[self._table].append((self._cells[0], status))
            self._cells = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cells:
            self._cells[-1] += data
