"""Entry point of the ``sglang.srt.plugins`` group; SGLang runs it in every process."""

from __future__ import annotations

import importlib
import logging

from sglang_iso import envvars
from sglang_iso.settings import Settings
from sglang_iso.settings import current as current_settings

logger = logging.getLogger(__name__)


def register() -> None:
    """Apply CPU compatibility, register the ``tenant`` backend and our hooks (in the comparison server,
    ``SGLANG_ISO_BASELINE=1``, the CPU compatibility only, unless the tenant cache is required, and the test
    plugins that measure both servers alike).

    Idempotent. If this raises, SGLang logs it and ``tenant`` stays unregistered,
    so a server launched by sglang-iso (which selects ``tenant``) refuses to start:
    a failed plugin never degrades into an unhardened server.

    Raises:
        RuntimeError: test plugins are named without the testing switch (see :func:`test_plugin_refusal`).
        SettingsError: a ``SGLANG_ISO_*`` variable holds a value not accepted (named).
    """
    settings = current_settings()  # NOTE: a malformed variable raises here, naming it: nothing is registered
    refusal = test_plugin_refusal(settings)
    if refusal is not None:
        raise RuntimeError(refusal)  # NOTE: before registering, so the tenant backend stays unregistered

    from sglang_iso.platform import bootstrap

    bootstrap.apply()
    if settings.baseline and not settings.require_tenant_cache:
        logger.warning(
            "sglang-iso: %s=1: plain upstream SGLang (CPU shims only, no tenant isolation)", envvars.BASELINE.name
        )
        _load_test_plugins(settings.test_plugins, baseline=True)
        return

    from sglang_iso.integration import registration

    registration.install()
    _load_test_plugins(settings.test_plugins)


def test_plugin_refusal(settings: Settings) -> str | None:
    """Why a server must not start with this environment's test plugins, or None.

    Extension point for the test harness, empty in production: ``SGLANG_ISO_TEST_PLUGINS`` names
    modules (comma-separated) whose ``register()`` runs in every SGLang process after our own hooks,
    e.g. ``sglang_iso_testing.plant`` (plants a foreign KV slot to prove the owner check refuses it).
    Such code corrupts requests on purpose, so it loads only with the explicit switch
    ``SGLANG_ISO_TESTING=1`` that only the test harness sets; the launcher and every process refuse otherwise.
    """
    if not settings.test_plugins or settings.testing:
        return None
    return (
        f"{envvars.TEST_PLUGINS.name}={','.join(settings.test_plugins)} loads test-only code into the server; "
        "refusing to start "
        f"(only the test harness sets it, together with {envvars.TESTING.name}=1)"
    )


def _load_test_plugins(names: tuple[str, ...], *, baseline: bool = False) -> None:
    """Run each named test plugin's ``register()``; in the comparison server (``baseline``) only those that declare
    ``MEASURES_BASELINE = True`` (timers that must see both servers alike; the others act on sglang-iso's state)."""
    for name in names:
        module = importlib.import_module(name)
        if baseline and not getattr(module, "MEASURES_BASELINE", False):
            logger.warning("sglang-iso: TEST plugin %s skipped in the comparison server", name)
            continue
        module.register()
        logger.warning("sglang-iso: TEST plugin %s loaded (%s=1): not for production", name, envvars.TESTING.name)
