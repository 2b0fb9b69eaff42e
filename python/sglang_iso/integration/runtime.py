"""The scheduler process's sglang-iso state, in one typed object built by the tenant cache factory.

SGLang calls our hooks with its own objects (a ``ModelRunner``, a ``Scheduler``, a request), never with
ours, so a hook finds the state of its process here: the tenant cache, the page-ownership table and the PD
transfer guard, with the settings they were built from. Who mutates: the factory
(:func:`sglang_iso.integration.backend.build_tenant_cache`) installs one at start; each member then mutates
itself on the scheduler thread. One per scheduler process (data parallel ranks are processes of their own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang_iso.integration.owner_check import OwnerTable
    from sglang_iso.integration.pd_transfer import PdGuard
    from sglang_iso.integration.tenant_cache import TenantRadixCache
    from sglang_iso.settings import Settings

__all__ = ["SchedulerRuntime", "active", "install", "owner_table", "pd_guard"]


@dataclass(frozen=True)
class SchedulerRuntime:
    """What the tenant cache factory built in this scheduler process."""

    settings: Settings
    """The process settings the parts below were built from."""
    cache: TenantRadixCache
    """The tenant tree cache SGLang's scheduler uses (its scrubber and host tier hang off it)."""
    page_owners: OwnerTable | None
    """Page-ownership table checked before every forward; None with ``--kv-owner-check off`` or no cache."""
    pd_guard: PdGuard | None
    """Transfer quarantine and tag check on a prefill/decode worker; None elsewhere."""


_active: SchedulerRuntime | None = None  # mutated by install() only


def install(runtime: SchedulerRuntime) -> SchedulerRuntime:
    """Make ``runtime`` this process's state (the factory, once per scheduler; a rebuilt cache replaces it)."""
    global _active
    _active = runtime
    return runtime


def active() -> SchedulerRuntime | None:
    """This process's state; None outside a scheduler with the tenant cache (an upstream server, the front end)."""
    return _active


def owner_table() -> OwnerTable | None:
    """The page-ownership table of this process, if the owner check is on."""
    runtime = _active
    return runtime.page_owners if runtime is not None else None


def pd_guard() -> PdGuard | None:
    """The PD transfer guard of this process, on a prefill/decode worker."""
    runtime = _active
    return runtime.pd_guard if runtime is not None else None
