"""LoRA adapters in the front end (tokenizer-manager process): allow-lists, adapter identities, unloads.

* Every request that names adapters is checked against its tenant's allow-list
  after SGLang resolved the name (so the OpenAI ``model: "<base>:<adapter>"``
  form is covered too); a refused adapter is a 403.
* A name that is not loaded (never, or unloaded by an admin) is refused with a
  400 before SGLang sees it. SGLang itself would silently load an unloaded
  adapter again from its old path (its reload path for evicted adapters), so an
  admin's unload also drops the name from that reload cache.
* An adapter's identity for the namespace tag is its name plus the content hash
  of its files (:func:`sglang_iso.server.adapters.content_hash`), taken when it is
  loaded and kept per load (SGLang's ``lora_id``) in the front-end state's
  :class:`~sglang_iso.server.adapters.AdapterVersions`. An adapter whose files cannot be hashed gets a
  per-load identity: it never shares across loads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any, NamedTuple

from fastapi import HTTPException

from sglang_iso import observability
from sglang_iso.server import adapters
from sglang_iso.server.adapters import AdapterVersions

logger = logging.getLogger(__name__)


def _process_versions() -> AdapterVersions | None:
    """This HTTP process's adapter versions; None without a tenants file (no tag binds an adapter then)."""
    from sglang_iso.integration.front import state

    front = state.current()
    return front.adapter_versions if front is not None else None


class AdapterIdentity(NamedTuple):
    """What the namespace tag binds for a request's adapter."""

    name: str
    """The adapter name the request used (``lora_path``)."""
    version: str
    """Content hash of the adapter's files at load time, or ``unhashed:<lora_id>``."""


class AdapterForbidden(HTTPException):
    """A tenant named an adapter it may not use: 403 on every front end."""

    def __init__(self, refusal: adapters.AdapterRefusal) -> None:
        super().__init__(status_code=refusal.status, detail=f"{refusal.field}: {refusal.reason}.")


class AdapterNotLoaded(ValueError):
    """A request named an adapter that is not loaded; SGLang answers a ValueError with ``status_code``."""

    status_code = 400


def resolve(
    manager: Any, allowed: Collection[str], lora_path: object, versions: AdapterVersions
) -> AdapterIdentity | None:
    """Check a request's (resolved) ``lora_path`` for its tenant; the identity its tag binds.

    Returns None for the base model, and for a list naming several adapters (or
    an adapter and the base model): then the tag binds no adapter, and each
    prompt's KV is still kept apart by the adapter load id SGLang appends to the
    key (see :mod:`sglang_iso.identity.tags`).

    Raises:
        AdapterForbidden: an adapter the tenant may not use, or a malformed ``lora_path`` (400).
        AdapterNotLoaded: an adapter that is not loaded.
    """
    names = adapters.adapter_names(lora_path)
    if names is None:
        raise AdapterForbidden(
            adapters.AdapterRefusal(adapters.ADAPTER_FIELD, "must be a string, or a list of strings and nulls", 400,
                                    "invalid_field")
        )  # fmt: skip
    refusal = adapters.refused_adapter(allowed, names)
    if refusal is not None:
        raise AdapterForbidden(refusal)
    refs = getattr(manager, "lora_ref_cache", None)
    if not names or not isinstance(refs, dict) or not getattr(manager, "enable_lora", False):
        return None  # base model; or LoRA is off and SGLang refuses the request itself
    for name in names:
        if name not in refs:
            raise AdapterNotLoaded(f"lora_path: adapter {name!r} is not loaded")
    single = [lora_path] if isinstance(lora_path, str) else lora_path
    if len(names) != 1 or not isinstance(single, list) or not all(single):
        return None
    ref = refs[names[0]]
    return AdapterIdentity(names[0], versions.of(str(ref.lora_id), getattr(ref, "lora_path", None)))


def prewarm(manager: Any, versions: AdapterVersions) -> None:
    """Hash the adapters loaded at startup, so the first request does not wait for it."""
    for ref in list(getattr(manager, "lora_ref_cache", {}).values()):
        versions.of(str(ref.lora_id), getattr(ref, "lora_path", None))


def after_load(original: Any, manager: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``load_lora_adapter``: record the content hash of the files this load read."""

    async def run() -> Any:
        path = getattr(obj, "lora_path", None)
        before = await asyncio.to_thread(adapters.content_hash, path)
        result = await original(manager, obj, *args, **kwargs)
        ref = getattr(manager, "lora_ref_cache", {}).get(getattr(obj, "lora_name", None))
        versions = _process_versions()
        if getattr(result, "success", False) and ref is not None:
            after = await asyncio.to_thread(adapters.content_hash, path)
            # NOTE: files that changed during the load may be half old, half new: no content identity then.
            stable = before if before is not None and before == after else None
            if versions is not None:
                versions.record(str(ref.lora_id), stable)
            observability.audit("adapter_loaded", adapter=ref.lora_name, content=(stable or "unhashed")[:16])
        return result

    return run()


def after_tensor_load(original: Any, manager: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``load_lora_adapter_from_tensors``: the content is the request's config and tensors."""

    async def run() -> Any:
        version = await asyncio.to_thread(adapters.tensors_hash, obj.config_dict, obj.serialized_named_tensors)
        result = await original(manager, obj, *args, **kwargs)
        ref = getattr(manager, "lora_ref_cache", {}).get(getattr(obj, "lora_name", None))
        versions = _process_versions()
        if getattr(result, "success", False) and ref is not None:
            if versions is not None:
                versions.record(str(ref.lora_id), version)
            observability.audit("adapter_loaded", adapter=ref.lora_name, content=(version or "unhashed")[:16])
        return result

    return run()


def after_unload(original: Any, manager: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``unload_lora_adapter``: an unloaded name stays unloaded until an admin loads it again, and
    the KV computed with it is released."""

    async def run() -> Any:
        result = await original(manager, obj, *args, **kwargs)
        name = getattr(obj, "lora_name", None)
        refs = getattr(manager, "lora_ref_cache", None)
        if getattr(result, "success", False) and isinstance(refs, dict):
            ref = refs.pop(name, None)
            versions = _process_versions()
            if ref is not None:
                if versions is not None:
                    versions.forget(str(ref.lora_id))
                await _flush_load(manager, str(ref.lora_id))
            observability.audit("adapter_unloaded", adapter=name)
        return result

    return run()


async def _flush_load(manager: Any, lora_id: str) -> None:
    """Release the KV computed with an unloaded adapter load: no request can match it again."""
    from sglang_iso.integration import commands

    try:
        await commands.send(manager, commands.flush_adapter(lora_id))
    except Exception:  # NOTE: unreachable entries are evicted anyway; a failed flush only delays that
        logger.exception("sglang-iso: flushing the entries of an unloaded adapter failed")
