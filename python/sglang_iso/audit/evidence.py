"""``sglang-iso evidence``: one report an auditor can read, from the configuration, a live server and test results.

    sglang-iso evidence --tenants-file tenants.toml [--base-url URL --admin-key-env VAR]
                        [--audit-json sglang-iso-audit/audit.json] [--leak-fuzz-json fuzz.json] [--out-dir DIR]
                        [--pdf [--browser PATH]]

Writes ``evidence.json``, ``evidence.md`` and ``evidence.html`` to ``--out-dir``, and with ``--pdf`` the HTML page
rendered by a headless Chromium into ``evidence.pdf``. Sections: the configuration
checked (tenants, cache policies, quotas, retention; no key hash or secret), what the server refuses at start (the
coverage table), the live server's isolation counters per rank (``/get_server_info``, ``/iso/tenants``,
``/iso/check``), the side-channel audit's verdicts (``sglang-iso audit``), the leak fuzzer's result
(``benchmark/leak_fuzz.py --json``), and the checks: each requirement with its sources (AISVS controls and the
demands behind this project: full cache identity, scrub on reuse, auditable hits, adversarial tests, bounded
retention), its status and
the evidence lines it rests on; then the OWASP AISVS 1.0 controls these checks show (see ``CONTROLS``), each with
the worst status of its checks. A status is ``pass``, ``fail``, ``not shown`` (the input that would show it was not
given) or ``not configured``. Exit codes: 0 no check failed, 1 a check failed, 2 bad arguments or an unreadable input.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from sglang_iso import coverage, envvars
from sglang_iso.tenancy.config import ConfigError, TenantsConfig, load_tenants_file

Status = Literal["pass", "fail", "not shown", "not configured"]
_WORST: tuple[Status, ...] = ("fail", "not shown", "not configured", "pass")


@dataclass(frozen=True)
class Control:
    """One requirement of OWASP AISVS 1.0 (github.com/OWASP/AISVS, ``1.0/en``) and the checks that show it."""

    id: str
    level: int
    text: str
    checks: tuple[str, ...]


CONTROLS = (
    Control("AISVS 5.6.1", 2, "Inference-time KV-cache entries are partitioned by authenticated session or tenant "
            "identity; automatic prefix caching does not share cached prefixes across distinct security principals "
            "(numbered 5.5.5 in earlier drafts)", ("E1", "E4", "E5")),
    Control("AISVS 5.6.2", 2, "Shared model serving infrastructure prevents one tenant's inference from influencing "
            "or observing another tenant's operations through shared model state", ("E1", "E2", "E4")),
    Control("AISVS 4.7.4", 2, "Accelerator memory is zeroed between jobs and tenants; no cross-tenant data remanence",
            ("E2",)),
    Control("AISVS 12.2.1", 1, "Deletion requests propagate to derived caches within a service-level window",
            ("E6",)),
)  # fmt: skip
"""The controls mapped; a control's status is the worst of its checks' (``fail`` before ``not shown``, ...)."""


def _sources(check_id: str, *demands: str) -> tuple[str, ...]:
    """The AISVS controls that list ``check_id``, then the demands it answers."""
    return (*(f"OWASP {c.id} (L{c.level})" for c in CONTROLS if check_id in c.checks), *demands)


@dataclass(frozen=True)
class Check:
    """One requirement and what shows it."""

    id: str
    requirement: str
    sources: tuple[str, ...]
    status: Status
    evidence: tuple[str, ...]


def configuration(config: TenantsConfig) -> dict[str, Any]:
    """The tenants file as an auditor needs it: no key hash, no secret (only its length)."""
    tenants = [
        {
            "id": t.id,
            "cache": t.cache_policy if t.group is None else f"group:{t.group}",
            "api_keys": len(t.key_hashes),
            "quota_tokens": t.quota_tokens,
            "host_quota_tokens": t.host_quota_tokens,
            "l3_quota_tokens": t.l3_quota_tokens,
            "cache_ttl_seconds": t.cache_ttl_seconds or config.default_cache_ttl_seconds,
            "cache_max_age_seconds": t.cache_max_age_seconds or config.default_cache_max_age_seconds,
            "adapters": sorted(t.adapters),
        }
        for t in config.tenants.values()
    ]
    prefixes = [
        {"name": p.name, "readers": "*" if p.tenants == "*" else sorted(p.tenants)} for p in config.shared_prefixes
    ]
    return {
        "source": str(config.source),
        "secret_bytes": len(config.secret),
        "admin_keys": len(config.admin_key_hashes),
        "tenants": tenants,
        "shared_prefixes": prefixes,
    }


def fetch_server(base_url: str, admin_key: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """The live server's isolation state: per-rank ``sglang_iso`` states, ``/iso/tenants`` and ``/iso/check``.

    Raises:
        OSError: the server cannot be reached or answers with an error status.
    """

    def get(path: str) -> Any:
        req = urllib.request.Request(base_url.rstrip("/") + path, headers={"Authorization": f"Bearer {admin_key}"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 500 and path == "/iso/check":
                return json.loads(exc.read())  # the check ran and failed: that is evidence, not an error
            raise OSError(f"GET {path}: HTTP {exc.code}") from None

    info = get("/get_server_info")
    ranks = [s.get("sglang_iso", {}) for s in info.get("internal_states", []) if isinstance(s, dict)]
    return {"base_url": base_url, "ranks": ranks, "tenants": get("/iso/tenants"), "check": get("/iso/check")}


def checks(
    config: dict[str, Any], server: dict[str, Any] | None, audit: dict[str, Any] | None, fuzz: dict[str, Any] | None
) -> list[Check]:
    """Every requirement with its status and evidence (pure: reads only its arguments)."""
    ranks = [r.get("tree_cache", {}) for r in (server or {}).get("ranks", [])]
    out = [_partitioning(config, ranks, audit, fuzz), _scrub(ranks), _auditable(server), _adversarial(audit, fuzz)]
    out.append(_integrity(server))
    out.append(_retention(config, ranks))
    return out


def _partitioning(
    config: dict[str, Any], ranks: list[dict[str, Any]], audit: dict[str, Any] | None, fuzz: dict[str, Any] | None
) -> Check:
    lines = [f"tenants file: {len(config['tenants'])} tenants, secret of {config['secret_bytes']} bytes"]
    status: Status = "pass"
    if not ranks:
        status = "not shown"
        lines.append("no live server given")
    for i, tree in enumerate(ranks):
        ok = tree.get("is_tenant") and tree.get("namespace_mode") == "tenants"
        bad = int(tree.get("rejected_tags") or 0) + int(tree.get("violations") or 0)
        lines.append(
            f"rank {i}: tree {tree.get('impl')}, namespace mode {tree.get('namespace_mode')}, "
            f"rejected tags {tree.get('rejected_tags')}, tree violations {tree.get('violations')}"
        )
        if not ok or bad:
            status = "fail"
    other = _scope(audit, "other-tenant")
    if other is not None:
        lines.append(f"side-channel audit, other tenant: {other.get('verdict')} (p={other.get('p_value')})")
        if _shows_sharing(other):
            status = "fail"
    if fuzz is not None:
        lines.append(f"leak fuzz: {fuzz.get('leaks')} leaks in {fuzz.get('requests')} requests")
        if fuzz.get("leaks"):
            status = "fail"
    return Check("E1", "The prefix cache is partitioned by authenticated tenant identity; nothing crosses tenants",
                 _sources("E1", "demand: tenant isolation, full cache identity"), status, tuple(lines))  # fmt: skip


def _scrub(ranks: list[dict[str, Any]]) -> Check:
    if not ranks:
        return Check("E2", "Freed KV pages are zeroed before reuse; a wrong index reads zeros",
                     _sources("E2", "demand: scrub on reuse"), "not shown", ("no live server given",))  # fmt: skip
    lines: list[str] = []
    status: Status = "pass"
    for i, tree in enumerate(ranks):
        lines.append(
            f"rank {i}: kv_scrub {tree.get('kv_scrub')} ({tree.get('scrubbed_pages', 0)} pages scrubbed), "
            f"kv_owner_check {tree.get('kv_owner_check')} ({tree.get('owner_violations', 0)} violations)"
        )
        if tree.get("kv_scrub") != "on-free" or tree.get("kv_owner_check") != "on":
            status = "fail"
    return Check("E2", "Freed KV pages are zeroed before reuse; a wrong index reads zeros",
                 _sources("E2", "demand: scrub on reuse"), status, tuple(lines))  # fmt: skip


def _auditable(server: dict[str, Any] | None) -> Check:
    req = "Every cache hit is attributed to a tenant and counted"
    if server is None:
        return Check("E3", req, _sources("E3", "demand: auditable hits"), "not shown", ("no live server given",))
    rows = server.get("tenants", {}).get("tenants", {})
    lines = [
        f"{tenant}: {row.get('served', {}).get('requests', 0)} requests, "
        f"{row.get('served', {}).get('cached_tokens', 0)} cached of {row.get('served', {}).get('prompt_tokens', 0)}"
        " prompt tokens"
        for tenant, row in sorted(rows.items())
    ]
    unverified = server.get("tenants", {}).get("unverified_tags", [])
    lines.append(f"unverified tags per rank: {unverified}")
    status: Status = "pass" if rows and not any(unverified) else "fail"
    return Check("E3", req, _sources("E3", "demand: auditable hits"), status, tuple(lines))


def _adversarial(audit: dict[str, Any] | None, fuzz: dict[str, Any] | None) -> Check:
    req = "Adversarial tests ran against this deployment, each with its positive control"
    lines: list[str] = []
    status: Status = "pass"
    if audit is None and fuzz is None:
        return Check(
            "E4", req, _sources("E4", "demand: adversarial tests"), "not shown", ("no audit or leak-fuzz result given",)
        )
    if audit is not None:
        for r in audit.get("results", []):
            lines.append(f"audit scope {r.get('scope')}: {r.get('verdict')} (KS p={r.get('p_value')})")
        control, other = _scope(audit, "same-key"), _scope(audit, "other-tenant")
        if control is None or not _shows_sharing(control) or other is None or _shows_sharing(other):
            status = "fail"
    else:
        lines.append("side-channel audit: not given")
        status = "not shown"
    if fuzz is not None:
        lines.append(
            f"leak fuzz (seed {fuzz.get('seed')}): {fuzz.get('requests')} requests, {fuzz.get('leaks')} leaks, "
            f"{fuzz.get('same_owner_hits')} same-owner hits, {fuzz.get('errors')} errors"
        )
        if fuzz.get("leaks") or fuzz.get("errors") or not fuzz.get("same_owner_hits"):
            status = "fail"
    else:
        lines.append("leak fuzz: not given")
        status = "fail" if status == "fail" else "not shown"
    return Check("E4", req, _sources("E4", "demand: adversarial tests"), status, tuple(lines))


def _integrity(server: dict[str, Any] | None) -> Check:
    req = "The tenant tree's invariants hold on every rank"
    if server is None:
        return Check("E5", req, _sources("E5", "demand: tenant isolation"), "not shown", ("no live server given",))
    ok = bool(server.get("check", {}).get("integrity_ok"))
    return Check(
        "E5", req, _sources("E5", "demand: tenant isolation"), "pass" if ok else "fail", (f"/iso/check: {ok}",)
    )


def _retention(config: dict[str, Any], ranks: list[dict[str, Any]]) -> Check:
    req = "Each tenant's cached KV has a bounded lifetime; L3 copies are encrypted under the tenant's key"
    limited = [t for t in config["tenants"] if t["cache_ttl_seconds"] or t["cache_max_age_seconds"]]
    lines = [
        f"{t['id']}: idle {t['cache_ttl_seconds'] or 'none'} s, lifetime {t['cache_max_age_seconds'] or 'none'} s"
        for t in config["tenants"]
    ]
    if any("l3_written_pages" in tree for tree in ranks):
        lines.append("L3 files: AES-256-GCM per tenant key (format v3)")
    status: Status = "pass" if len(limited) == len(config["tenants"]) else "not configured"
    return Check("E6", req, _sources("E6", "demand: bounded retention, provable deletion"), status, tuple(lines))


def _scope(audit: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    for r in (audit or {}).get("results", []):
        if r.get("scope") == name:
            return dict(r)
    return None


def _shows_sharing(result: dict[str, Any]) -> bool:
    oracle = result.get("oracle") or {}
    return bool(result.get("detected")) or bool(oracle.get("detected"))


def build(
    config: TenantsConfig,
    server: dict[str, Any] | None = None,
    audit: dict[str, Any] | None = None,
    fuzz: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole report as JSON-safe data."""
    conf = configuration(config)
    found = checks(conf, server, audit, fuzz)
    return {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "configuration": conf,
        "refused_at_start": [{"feature": r.feature, "stages": list(r.stages)} for r in coverage.ROWS],
        "model_families": [f._asdict() for f in coverage.FAMILIES],
        "server": server,
        "audit": None if audit is None else {"results": audit.get("results", [])},
        "leak_fuzz": fuzz,
        "checks": [asdict(c) for c in found],
        "controls": controls(found),
    }


def controls(found: Sequence[Check]) -> list[dict[str, Any]]:
    """Each AISVS control of :data:`CONTROLS` with the worst status of its checks."""
    status = {c.id: c.status for c in found}
    out = []
    for control in CONTROLS:
        mine = [status[i] for i in control.checks if i in status]
        worst = min(mine, key=_WORST.index) if len(mine) == len(control.checks) else "fail"
        out.append({**asdict(control), "status": worst})
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# sglang-iso evidence report ({report['generated_at']})", "", "## Checks", ""]
    lines += ["| id | requirement | source | status |", "|---|---|---|---|"]
    for c in report["checks"]:
        lines.append(f"| {c['id']} | {c['requirement']} | {'; '.join(c['sources'])} | **{c['status']}** |")
    lines += ["", "## OWASP AISVS 1.0 controls", "", "| control | level | requirement | checks | status |"]
    lines.append("|---|---|---|---|---|")
    for c in report["controls"]:
        lines.append(f"| {c['id']} | L{c['level']} | {c['text']} | {', '.join(c['checks'])} | **{c['status']}** |")
    for c in report["checks"]:
        lines += ["", f"### {c['id']}: {c['status']}", "", *(f"- {e}" for e in c["evidence"])]
    conf = report["configuration"]
    lines += [
        "",
        "## Configuration",
        "",
        f"Tenants file `{conf['source']}`; secret of {conf['secret_bytes']} bytes.",
        "",
    ]
    lines += ["| tenant | cache | keys | quota | idle retention s | lifetime s |", "|---|---|---|---|---|---|"]
    for t in conf["tenants"]:
        lines.append(
            f"| {t['id']} | {t['cache']} | {t['api_keys']} | {t['quota_tokens'] or 'none'} | "
            f"{t['cache_ttl_seconds'] or 'none'} | {t['cache_max_age_seconds'] or 'none'} |"
        )
    lines += ["", "## Refused at start", "", *(f"- {r['feature']}" for r in report["refused_at_start"])]
    return "\n".join(lines) + "\n"


def html_page(report: dict[str, Any]) -> str:
    def cell(value: object) -> str:
        return f"<td>{html.escape(str(value))}</td>"

    rows = "".join(
        f'<tr class="{html.escape(c["status"].replace(" ", "-"))}">'
        + "".join(cell(v) for v in (c["id"], c["requirement"], "; ".join(c["sources"]), c["status"]))
        + "<td><ul>"
        + "".join(f"<li>{html.escape(e)}</li>" for e in c["evidence"])
        + "</ul></td></tr>"
        for c in report["checks"]
    )
    tenants = "".join(
        "<tr>" + "".join(cell(t[k]) for k in ("id", "cache", "api_keys", "quota_tokens", "cache_ttl_seconds")) + "</tr>"
        for t in report["configuration"]["tenants"]
    )
    controls = "".join(
        f'<tr class="{html.escape(c["status"].replace(" ", "-"))}">'
        + "".join(cell(v) for v in (c["id"], f"L{c['level']}", c["text"], ", ".join(c["checks"]), c["status"]))
        + "</tr>"
        for c in report["controls"]
    )
    refused = "".join(f"<li>{html.escape(r['feature'])}</li>" for r in report["refused_at_start"])
    style = "table{border-collapse:collapse}td,th{border:1px solid #999;padding:4px}.fail{background:#fdd}"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>sglang-iso evidence</title>'
        f"<style>{style}</style></head><body>"
        f"<h1>sglang-iso evidence report</h1><p>Generated {html.escape(report['generated_at'])}</p>"
        f'<h2>Checks</h2><table id="checks"><tr><th>id</th><th>requirement</th><th>source</th><th>status</th>'
        f"<th>evidence</th></tr>{rows}</table>"
        f'<h2>OWASP AISVS 1.0 controls</h2><table id="controls"><tr><th>control</th><th>level</th>'
        f"<th>requirement</th><th>checks</th><th>status</th></tr>{controls}</table>"
        f"<h2>Tenants</h2><table><tr><th>tenant</th><th>cache</th><th>keys</th><th>quota</th>"
        f"<th>idle retention s</th></tr>{tenants}</table>"
        f"<h2>Refused at start</h2><ul>{refused}</ul></body></html>\n"
    )


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
RENDER_TIMEOUT_S = 120.0


def find_browser(given: str | None = None) -> str | None:
    """``given`` when it is an executable, else the first of :data:`BROWSERS` on PATH; None when there is none."""
    if given is not None:
        return shutil.which(given)
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def _headless(browser: str) -> list[str]:
    # NOTE: Chromium refuses to run as root with its sandbox on; the page is our own static HTML, no script
    sandbox = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return [browser, "--headless", "--disable-gpu", "--no-first-run", *sandbox]


def render_pdf(browser: str, page: Path, out: Path) -> None:
    """Render ``page`` with headless Chromium into the PDF ``out``; raises when Chromium fails or writes nothing."""
    out.unlink(missing_ok=True)
    cmd = [*_headless(browser), "--no-pdf-header-footer", f"--print-to-pdf={out.resolve()}", page.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, timeout=RENDER_TIMEOUT_S, check=False)
    if done.returncode != 0 or not out.is_file() or out.read_bytes()[:5] != b"%PDF-":
        tail = done.stderr.decode(errors="replace")[-400:]
        raise subprocess.SubprocessError(f"{browser} exited {done.returncode} without a PDF: {tail}")


def rendered_dom(browser: str, page: Path) -> str:
    """The DOM of ``page`` after headless Chromium has loaded and laid it out."""
    done = subprocess.run([*_headless(browser), "--dump-dom", page.resolve().as_uri()], capture_output=True,
                          timeout=RENDER_TIMEOUT_S, check=True)  # fmt: skip
    return done.stdout.decode()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-iso evidence", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--tenants-file", required=True, type=Path)
    parser.add_argument("--base-url", default=None, help="a running server to read counters from (admin key needed)")
    parser.add_argument("--admin-key-env", default=envvars.ADMIN_KEY.name, help="variable holding the admin key")
    parser.add_argument("--audit-json", type=Path, default=None, help="audit.json of `sglang-iso audit`")
    parser.add_argument("--leak-fuzz-json", type=Path, default=None, help="the --json output of leak_fuzz.py")
    parser.add_argument("--out-dir", type=Path, default=Path("sglang-iso-evidence"))
    parser.add_argument("--pdf", action="store_true", help="also render evidence.html to evidence.pdf (Chromium)")
    parser.add_argument("--browser", default=None, help="the headless Chromium to render with (default: on PATH)")
    args = parser.parse_args(argv)
    browser = find_browser(args.browser) if args.pdf else None
    if args.pdf and browser is None:
        print(
            "sglang-iso evidence: --pdf needs Chromium (apt-get install chromium, or --browser PATH)", file=sys.stderr
        )
        return 2
    try:
        config = load_tenants_file(args.tenants_file)
        audit = json.loads(args.audit_json.read_text()) if args.audit_json else None
        fuzz = json.loads(args.leak_fuzz_json.read_text()) if args.leak_fuzz_json else None
        server = None
        if args.base_url:
            key = os.environ.get(args.admin_key_env)
            if not key:
                print(f"sglang-iso evidence: --base-url needs the admin key in ${args.admin_key_env}", file=sys.stderr)
                return 2
            server = fetch_server(args.base_url, key)
    except (ConfigError, OSError, ValueError) as exc:
        print(f"sglang-iso evidence: {exc}", file=sys.stderr)
        return 2
    report = build(config, server, audit, fuzz)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "evidence.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    (args.out_dir / "evidence.md").write_text(markdown(report))
    (args.out_dir / "evidence.html").write_text(html_page(report))
    if browser is not None:
        try:
            render_pdf(browser, args.out_dir / "evidence.html", args.out_dir / "evidence.pdf")
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"sglang-iso evidence: --pdf: {exc}", file=sys.stderr)
            return 2
    for c in report["checks"]:
        print(f"{c['id']} {c['status']:<14} {c['requirement']}")
    print(f"written to {args.out_dir}/evidence.{{json,md,html{',pdf' if browser else ''}}}")
    return 1 if any(c["status"] == "fail" for c in report["checks"]) else 0
