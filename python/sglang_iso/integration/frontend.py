"""Front-end hooks (HTTP/tokenizer-manager process): the tenant gate and namespace tags.

Active only when the launcher passed a tenants file (``TENANTS_FILE_ENV``). Each concern lives in
:mod:`sglang_iso.integration.front`; this module registers the hooks and names their targets.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_iso import envvars
from sglang_iso.integration import lora
from sglang_iso.integration.front.gate import install_gate, tenants_config
from sglang_iso.integration.front.tagging import TAG_TARGET, tag_and_observe
from sglang_iso.integration.front.weights import WEIGHT_TARGETS, after_weight_update

__all__ = ["FRONTEND_HOOK_TARGETS", "METRICS_AUTH_ENV", "TENANTS_FILE_ENV", "install", "tenants_config"]

TENANTS_FILE_ENV = envvars.TENANTS_FILE.name
METRICS_AUTH_ENV = envvars.METRICS_AUTH.name  # "admin" (default) or "open"

GATE_TARGET = "sglang.srt.entrypoints.http_server._setup_and_run_http_server"
FRONTEND_HOOK_TARGETS = (GATE_TARGET, TAG_TARGET, *WEIGHT_TARGETS, *lora.LORA_HOOK_TARGETS)
"""Every target the front end hooks; with a tenants file the launcher refuses to serve unless all were applied."""


def install() -> None:
    """Register the front-end hooks (every process; they only act in the HTTP process)."""
    HookRegistry.register(GATE_TARGET, install_gate, HookType.BEFORE)
    HookRegistry.register(TAG_TARGET, tag_and_observe, HookType.AROUND)
    for target in WEIGHT_TARGETS:
        HookRegistry.register(target, after_weight_update, HookType.AROUND)
    lora.install()
