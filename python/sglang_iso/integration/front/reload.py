"""SIGHUP reloads the tenants file: keys, tenants and tags change for new requests only."""

from __future__ import annotations

import logging
import signal
from typing import Any

from sglang_iso import observability
from sglang_iso.integration.front.state import FrontState
from sglang_iso.server.gate import ReloadableKeys
from sglang_iso.settings import current as current_settings
from sglang_iso.tenancy.keys import KeyIndex

logger = logging.getLogger(__name__)


def install_reload(keys: ReloadableKeys, front: FrontState) -> None:
    """Reload the tenants file on SIGHUP.

    A file that fails validation, or that changes the namespace secret (the
    scheduler verifies tags with the secret it started with), is rejected and the
    running config stays. Quotas, cache policies and shared prefixes are read by
    the scheduler at start; a changed value takes effect at the next restart. A tenant (or group) the new file
    no longer has is erased in every tier by the retention sweeper (``front.removed_owners``).
    """

    def reload(_signum: int, _frame: Any) -> None:
        try:
            new = current_settings().tenants()
        except ValueError as exc:
            logger.error("sglang-iso: tenants file reload rejected, keeping the running config: %s", exc)
            observability.audit("config_reload", ok=False, error=str(exc))
            return
        if new is None or new.secret != front.config.secret:
            logger.error("sglang-iso: tenants file reload rejected: the namespace secret changed (restart instead)")
            observability.audit("config_reload", ok=False, error="namespace secret changed")
            return
        keys.swap(KeyIndex(new))
        front.replace_config(new)
        logger.warning("sglang-iso: tenants file reloaded: %d tenants", len(new.tenants))
        observability.audit("config_reload", ok=True, tenants=sorted(new.tenants))

    signal.signal(signal.SIGHUP, reload)
