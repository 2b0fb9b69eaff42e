"""Entry point of the ``sglang.srt.plugins`` group; SGLang runs it in every process."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def register() -> None:
    """Apply CPU compatibility, register the ``tenant`` backend and our hooks.

    Idempotent. If this raises, SGLang logs it and ``tenant`` stays unregistered,
    so a server launched by sglang-iso (which selects ``tenant``) refuses to start:
    a failed plugin never degrades into an unhardened server.
    """
    from sglang_iso.platform import bootstrap

    bootstrap.apply()

    from sglang_iso.integration import registration

    registration.install()
