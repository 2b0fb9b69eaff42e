"""Front-end hooks (HTTP/tokenizer-manager process): the tenant gate and namespace tags.

Active only when the launcher passed a tenants file (``TENANTS_FILE_ENV``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_iso import observability
from sglang_iso.integration import lora
from sglang_iso.server.admission import Admission, default_limit
from sglang_iso.server.gate import STATE_TENANT, ReloadableKeys, TenantGate
from sglang_iso.server.pd_rules import pd_role
from sglang_iso.server.request_rules import Limits
from sglang_iso.server.tagging import NamespaceTagger, fingerprint_dir
from sglang_iso.tenancy.config import TenantsConfig, load_tenants_file
from sglang_iso.tenancy.keys import KeyIndex

logger = logging.getLogger(__name__)

TENANTS_FILE_ENV = "SGLANG_ISO_TENANTS_FILE"
METRICS_AUTH_ENV = "SGLANG_ISO_METRICS_AUTH"  # "admin" (default) or "open"

_GATE_TARGET = "sglang.srt.entrypoints.http_server._setup_and_run_http_server"
_TAG_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"
_WEIGHT_TARGETS = (
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_weights_from_disk",
    "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.update_weights_from_tensor",
    "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.update_weights_from_distributed",
    "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.update_weights_from_ipc",
)
FRONTEND_HOOK_TARGETS = (_GATE_TARGET, _TAG_TARGET, *_WEIGHT_TARGETS, *lora.LORA_HOOK_TARGETS)

_tagger: NamespaceTagger | None = None
_server_args: Any = None
_weights_generation = 0  # bumped after every weight update: part of the model fingerprint


def install() -> None:
    """Register the front-end hooks (every process; they only act in the HTTP process)."""
    HookRegistry.register(_GATE_TARGET, install_gate, HookType.BEFORE)
    HookRegistry.register(_TAG_TARGET, tag_and_observe, HookType.AROUND)
    for target in _WEIGHT_TARGETS:
        HookRegistry.register(target, after_weight_update, HookType.AROUND)
    lora.install()


def tenants_config() -> TenantsConfig | None:
    path = os.environ.get(TENANTS_FILE_ENV)
    return load_tenants_file(path) if path else None


def install_gate(*args: Any, **kwargs: Any) -> None:
    """BEFORE ``_setup_and_run_http_server``: put the tenant gate in front of SGLang's app.

    Raises:
        RuntimeError: the gate could not be installed while a tenants file is set.
    """
    global _tagger
    config = tenants_config()
    if config is None:
        return
    from sglang.srt.entrypoints import http_server

    keys = ReloadableKeys(KeyIndex(config))
    server_args = kwargs.get("server_args", args[0] if args else None)
    tokenizer_manager = kwargs.get("tokenizer_manager", args[1] if len(args) > 1 else None)
    holder = _ConfigHolder(config)
    admission = Admission(
        lambda tenant: _tenant_limit(holder, tenant),
        default=default_limit(getattr(server_args, "max_running_requests", None)),
    )
    http_server.app.add_middleware(
        TenantGate,
        keys=keys,
        limits=_model_limits(tokenizer_manager),
        admission=admission,
        metrics_need_admin=os.environ.get(METRICS_AUTH_ENV, "admin") != "open",
        pd=pd_role(getattr(server_args, "disaggregation_mode", None),
                   getattr(server_args, "disaggregation_transfer_backend", None)),
    )  # fmt: skip
    global _server_args
    _server_args = server_args
    _tagger = _make_tagger(config, server_args)
    _add_iso_routes(http_server.app, tokenizer_manager, holder)
    lora.prewarm(tokenizer_manager)
    _install_reload(keys, holder, server_args)
    logger.info("sglang-iso: tenant gate installed for %d tenants", len(config.tenants))


def _tenant_limit(holder: _ConfigHolder, tenant_id: str) -> int | None:
    tenant = holder.config.tenants.get(tenant_id)
    return tenant.max_concurrent_requests if tenant is not None else None


def _model_limits(tokenizer_manager: Any) -> Limits | None:
    """Vocabulary size and context length of the served model, for the gate's bounds."""
    model_config = getattr(tokenizer_manager, "model_config", None)
    vocab = getattr(model_config, "vocab_size", None)
    context = getattr(tokenizer_manager, "context_len", None)
    if not isinstance(vocab, int) or not isinstance(context, int):
        logger.error("sglang-iso: model limits unknown; token ids and budgets are left to SGLang's checks")
        return None
    return Limits(vocab_size=vocab, context_len=context)


class _ConfigHolder:
    """The front end's current tenants config (replaced on reload)."""

    def __init__(self, config: TenantsConfig) -> None:
        self.config = config


def _install_reload(keys: ReloadableKeys, holder: _ConfigHolder, server_args: Any) -> None:
    """Reload the tenants file on SIGHUP: keys, tenants and tags change for new requests only.

    A file that fails validation, or that changes the namespace secret (the
    scheduler verifies tags with the secret it started with), is rejected and the
    running config stays. Quotas, cache policies and shared prefixes are read by
    the scheduler at start; a changed value takes effect at the next restart.
    """
    import signal

    def reload(_signum: int, _frame: Any) -> None:
        global _tagger
        path = os.environ.get(TENANTS_FILE_ENV)
        try:
            new = load_tenants_file(path) if path else None
        except ValueError as exc:
            logger.error("sglang-iso: tenants file reload rejected, keeping the running config: %s", exc)
            observability.audit("config_reload", ok=False, error=str(exc))
            return
        if new is None or new.secret != holder.config.secret:
            logger.error("sglang-iso: tenants file reload rejected: the namespace secret changed (restart instead)")
            observability.audit("config_reload", ok=False, error="namespace secret changed")
            return
        keys.swap(KeyIndex(new))
        _tagger = _make_tagger(new, server_args)
        holder.config = new
        logger.warning("sglang-iso: tenants file reloaded: %d tenants", len(new.tenants))
        observability.audit("config_reload", ok=True, tenants=sorted(new.tenants))

    signal.signal(signal.SIGHUP, reload)


def _add_iso_routes(app: Any, tokenizer_manager: Any, holder: _ConfigHolder) -> None:
    """``GET /iso/tenants``, ``POST /iso/flush``, ``GET /iso/check``, ``GET /iso/pd`` (transfer quarantine) and
    ``POST /iso/pd/reclaim`` (admin-only: the gate lets only admins reach /iso/*)."""
    from fastapi.responses import ORJSONResponse

    from sglang_iso.integration.hooks import FLUSH_COMMAND

    async def iso_tenants() -> Any:
        config = holder.config
        states = await tokenizer_manager.get_internal_state()
        states = sorted(states, key=lambda s: s.get("sglang_iso", {}).get("dp_rank", 0))  # replies come unordered
        per_rank = [s.get("sglang_iso", {}).get("tenants", {}) for s in states]
        tenants: dict[str, Any] = {}
        for tenant in config.tenants.values():
            owner = tenant.group or tenant.id
            tenants[tenant.id] = {
                "cache": tenant.cache_policy if tenant.group is None else f"group:{tenant.group}",
                "quota_tokens": tenant.quota_tokens,
                "ranks": [rank.get(owner, {}) for rank in per_rank],
            }
        # Tags the scheduler could not verify (forged or malformed): isolation violations of no known tenant.
        unverified = [s.get("sglang_iso", {}).get("tree_cache", {}).get("rejected_tags", 0) for s in states]
        return ORJSONResponse({"tenants": tenants, "unverified_tags": unverified})

    async def iso_flush(body: dict[str, Any]) -> Any:
        config = holder.config
        tenant_id = body.get("tenant") if isinstance(body, dict) else None
        tenant = config.tenants.get(tenant_id) if isinstance(tenant_id, str) else None
        if tenant is None:
            return ORJSONResponse(
                {
                    "error": {
                        "message": f"unknown tenant {tenant_id!r}",
                        "type": "invalid_request_error",
                        "param": "tenant",
                        "code": "unknown_tenant",
                    }
                },
                status_code=400,
            )
        from sglang.srt.managers.io_struct import SetInternalStateReq

        owner = tenant.group or tenant.id
        results = await tokenizer_manager.set_internal_state(
            SetInternalStateReq(server_args={FLUSH_COMMAND + owner: 1})
        )
        ok = bool(results) and all(results)
        return ORJSONResponse(
            {"flushed": ok, "tenant": tenant.id, "namespace_owner": owner}, status_code=200 if ok else 500
        )

    async def iso_check() -> Any:
        from sglang.srt.managers.io_struct import SetInternalStateReq

        from sglang_iso.integration.hooks import CHECK_COMMAND

        results = await tokenizer_manager.set_internal_state(SetInternalStateReq(server_args={CHECK_COMMAND: 1}))
        ok = bool(results) and all(results)
        return ORJSONResponse({"integrity_ok": ok}, status_code=200 if ok else 500)

    async def iso_pd(command: str) -> Any:
        from sglang.srt.managers.io_struct import SetInternalStateReq

        results = await tokenizer_manager.set_internal_state(SetInternalStateReq(server_args={command: 1}))
        states = await tokenizer_manager.get_internal_state()
        pd = [s.get("sglang_iso", {}).get("pd") for s in states]
        ok = bool(results) and all(results)
        return ORJSONResponse({"ok": ok, "pd": pd}, status_code=200 if ok else 409)

    from sglang_iso.integration.hooks import PD_RECLAIM_COMMAND, PD_STATUS_COMMAND

    async def iso_pd_status() -> Any:
        return await iso_pd(PD_STATUS_COMMAND)

    async def iso_pd_reclaim() -> Any:
        return await iso_pd(PD_RECLAIM_COMMAND)

    app.add_api_route("/iso/pd", iso_pd_status, methods=["GET"])
    app.add_api_route("/iso/pd/reclaim", iso_pd_reclaim, methods=["POST"])
    app.add_api_route("/iso/check", iso_check, methods=["GET"])
    app.add_api_route("/iso/tenants", iso_tenants, methods=["GET"])
    app.add_api_route("/iso/flush", iso_flush, methods=["POST"])


def _make_tagger(config: TenantsConfig, server_args: Any) -> NamespaceTagger:
    model_path = getattr(server_args, "model_path", None)
    tokenizer_path = getattr(server_args, "tokenizer_path", None) or model_path
    model_fp = fingerprint_dir(model_path, "config.json", "model.safetensors", "model.safetensors.index.json")
    revision = getattr(server_args, "revision", None)
    if revision:
        model_fp = f"{model_fp}@{revision}"
    model_fp = f"{model_fp}#weights{_weights_generation}"
    return NamespaceTagger(
        config,
        model_fingerprint=model_fp,
        tokenizer_fingerprint=fingerprint_dir(tokenizer_path, "tokenizer.json", "tokenizer_config.json"),
        kv_dtype=str(getattr(server_args, "kv_cache_dtype", None) or "auto"),
        page_size=int(getattr(server_args, "page_size", None) or 1),
    )


def after_weight_update(original: Any, manager: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND every weight-update entry point: new weights get new namespaces, old entries are dropped.

    The model fingerprint in every later tag changes, so nothing cached under the
    old weights can match again, even when the caller asked SGLang not to flush
    (``flush_cache: false``) or its flush was refused; then every tenant's
    unlocked entries are released (and scrubbed) in the scheduler.
    """

    async def run() -> Any:
        global _tagger, _weights_generation
        try:
            return await original(manager, *args, **kwargs)
        finally:
            if os.environ.get(TENANTS_FILE_ENV) is not None and _tagger is not None:
                _weights_generation += 1
                _tagger = _make_tagger(_tagger.config, _server_args)
                await _flush_all(manager)
                observability.audit("weights_updated", generation=_weights_generation)

    return run()


async def _flush_all(manager: Any) -> None:
    from sglang.srt.managers.io_struct import SetInternalStateReq

    from sglang_iso.integration.hooks import FLUSH_COMMAND

    try:
        await manager.set_internal_state(SetInternalStateReq(server_args={FLUSH_COMMAND + "*": 1}))
    except Exception:  # NOTE: namespaces already changed; a failed flush only delays eviction
        logger.exception("sglang-iso: flushing old namespaces after a weight update failed")


def tag_and_observe(original: Any, manager: Any, obj: Any, request: Any = None, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``TokenizerManager.generate_request``: tag the request, then observe its outputs.

    Tagging overwrites the namespace with the server's tag; a request without an
    authenticated tenant (an internal or unexpected path) gets no tag, so the
    scheduler serves it without any prefix sharing. Observation feeds the
    per-tenant metrics and the audit log from the final outputs.
    """
    request = kwargs.pop("request", request)
    try:
        tenant = tag_request(obj, request, manager)
    except (lora.AdapterForbidden, lora.AdapterNotLoaded) as exc:
        return _refused(exc)
    outputs = original(manager, obj, request, *args, **kwargs)
    if tenant is None or (observability.metrics() is None and observability.audit_logger() is None):
        return outputs
    return _observe(outputs, tenant, _short_namespace(getattr(obj, "extra_key", None)))


def tag_request(obj: Any, request: Any, manager: Any = None) -> str | None:
    """Overwrite ``obj``'s namespace fields; returns the authenticated tenant, if any.

    Raises:
        lora.AdapterForbidden: the request names an adapter its tenant may not use.
        lora.AdapterNotLoaded: the request names an adapter that is not loaded.
    """
    if os.environ.get(TENANTS_FILE_ENV) is None:
        return None
    state = getattr(getattr(request, "state", None), STATE_TENANT, None) if request is not None else None
    tenant = state if isinstance(state, str) else None
    tagger = _tagger
    if hasattr(obj, "lora_id"):
        obj.lora_id = None  # NOTE: SGLang sets it from lora_path; a client-chosen id would skip the allow-list
    entry = tagger.config.tenants.get(tenant) if tagger is not None and tenant is not None else None
    adapter = lora.resolve(manager, entry.adapters if entry is not None else (), getattr(obj, "lora_path", None))
    tag = None
    if tenant is not None and tagger is not None:
        salt = getattr(obj, "cache_salt", None)
        tag = tagger.tag(
            tenant,
            cache_salt=salt if isinstance(salt, str) else None,
            adapter=adapter.name if adapter is not None else None,
            adapter_version=adapter.version if adapter is not None else None,
        )
    if hasattr(obj, "extra_key"):
        obj.extra_key = tag
    if hasattr(obj, "cache_salt"):
        obj.cache_salt = None
    return tenant


async def _refused(exc: Exception) -> Any:
    # NOTE: raised from the generator, as SGLang raises its own request errors, so every front end answers it.
    raise exc
    yield  # pragma: no cover - makes this an async generator


def _short_namespace(tag: Any) -> str | None:
    # iso1.<owner>.<namespace id>.<mac>: the first 12 hex chars of the id identify it in logs.
    parts = tag.split(".") if isinstance(tag, str) else []
    return parts[2][:12] if len(parts) == 4 else None


async def _observe(outputs: Any, tenant: str, namespace: str | None) -> Any:
    async for out in outputs:
        for item in out if isinstance(out, list) else [out]:
            meta = item.get("meta_info") if isinstance(item, dict) else None
            if isinstance(meta, dict) and meta.get("finish_reason") is not None:
                _record(tenant, namespace, meta)
        yield out


def _record(tenant: str, namespace: str | None, meta: dict[str, Any]) -> None:
    prompt_tokens = int(meta.get("prompt_tokens") or 0)
    cached = int(meta.get("cached_tokens") or 0)
    m = observability.metrics()
    if m is not None:
        m["prompt_tokens"].labels(tenant=tenant).inc(prompt_tokens)
        m["cached_tokens"].labels(tenant=tenant).inc(cached)
    if cached > 0:
        observability.audit(
            "cache_hit", tenant=tenant, namespace=namespace, hit_tokens=cached,
            prompt_tokens=prompt_tokens, rid=meta.get("id"),
        )  # fmt: skip
