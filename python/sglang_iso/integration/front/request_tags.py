"""Every request gets its tenant's namespace tag, set server-side over whatever the client sent."""

from __future__ import annotations

from typing import Any

from sglang_iso.integration import lora
from sglang_iso.integration.front import metrics, state, sweeper
from sglang_iso.server.adapters import AdapterVersions
from sglang_iso.server.gate import STATE_CACHE_TTL, STATE_TENANT
from sglang_iso.settings import current as current_settings


def tag_and_observe(original: Any, manager: Any, obj: Any, request: Any = None, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``TokenizerManager.generate_request``: tag the request, then observe its outputs.

    Tagging overwrites the namespace with the server's tag; a request without an
    authenticated tenant (an internal or unexpected path) gets no tag, so the
    scheduler serves it without any prefix sharing. Observation feeds the
    served-token counts of ``GET /iso/tenants``, the per-tenant metrics and the
    audit log from the final outputs.
    """
    request = kwargs.pop("request", request)
    try:
        tenant = tag_request(obj, request, manager)
    except (lora.AdapterForbidden, lora.AdapterNotLoaded) as exc:
        return _refused(exc)
    outputs = original(manager, obj, request, *args, **kwargs)
    front = state.current()
    if tenant is None:
        return outputs
    entry = front.config.tenants.get(tenant) if front is not None else None
    if front is not None and entry is not None:
        owner = entry.group or entry.id
        asked = getattr(getattr(request, "state", None), STATE_CACHE_TTL, None) if request is not None else None
        if isinstance(asked, int) and asked > 0:  # X-Cache-TTL-Seconds, checked by the gate
            front.retention.shorten(owner, asked)
        if front.retention.tracks(owner):
            outputs = sweeper.track(outputs, owner, front.retention)
    if front is None and not metrics.enabled():
        return outputs
    namespace = metrics.short_namespace(getattr(obj, "extra_key", None))
    return metrics.observe(outputs, tenant, namespace, front.served if front is not None else None)


def tag_request(obj: Any, request: Any, manager: Any = None) -> str | None:
    """Overwrite ``obj``'s namespace fields; returns the authenticated tenant, if any.

    Raises:
        lora.AdapterForbidden: the request names an adapter its tenant may not use.
        lora.AdapterNotLoaded: the request names an adapter that is not loaded.
    """
    if current_settings().tenants_file is None:
        return None
    tenant_state = getattr(getattr(request, "state", None), STATE_TENANT, None) if request is not None else None
    tenant = tenant_state if isinstance(tenant_state, str) else None
    front = state.current()
    tagger = front.tagger if front is not None else None
    if hasattr(obj, "lora_id"):
        obj.lora_id = None  # NOTE: SGLang sets it from lora_path; a client-chosen id would skip the allow-list
    entry = tagger.config.tenants.get(tenant) if tagger is not None and tenant is not None else None
    versions = front.adapter_versions if front is not None else AdapterVersions()  # no front: no tag either
    adapter = lora.resolve(manager, entry.adapters if entry is not None else (), getattr(obj, "lora_path", None),
                           versions)  # fmt: skip
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
