"""Installing the tenant gate in front of SGLang's app, with the /iso/* routes and the SIGHUP reload."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

from sglang_iso.integration import lora
from sglang_iso.integration.front import reload, routes, state, sweeper
from sglang_iso.server.admission import Admission, default_limit
from sglang_iso.server.gate import ReloadableKeys, TenantGate
from sglang_iso.server.pd_rules import pd_role
from sglang_iso.server.rate_limits import RateLimiter, RateLimits
from sglang_iso.server.request_rules import Limits
from sglang_iso.settings import current as current_settings
from sglang_iso.tenancy.keys import KeyIndex

logger = logging.getLogger(__name__)


def install_gate(*args: Any, **kwargs: Any) -> None:
    """BEFORE ``_setup_and_run_http_server``: put the tenant gate in front of SGLang's app.

    Raises:
        RuntimeError: the gate could not be installed while a tenants file is set.
    """
    settings = current_settings()
    config = settings.tenants()
    if config is None:
        return
    from sglang.srt.entrypoints import http_server

    keys = ReloadableKeys(KeyIndex(config))
    server_args = kwargs.get("server_args", args[0] if args else None)
    tokenizer_manager = kwargs.get("tokenizer_manager", args[1] if len(args) > 1 else None)
    front = state.FrontState(config, server_args)
    admission = Admission(
        lambda tenant: _tenant_limit(front, tenant),
        default=default_limit(getattr(server_args, "max_running_requests", None)),
        queue_of=lambda tenant: _tenant_queue(front, tenant),
    )
    rates = RateLimiter(lambda tenant: _tenant_rates(front, tenant))
    front.internal_key = secrets.token_urlsafe(32)
    http_server.app.add_middleware(
        TenantGate,
        keys=keys,
        limits=_model_limits(tokenizer_manager),
        admission=admission,
        rates=rates,
        count_tokens=_token_counter(tokenizer_manager),
        internal_key=front.internal_key,
        on_start=lambda: sweeper.start_sweeper(tokenizer_manager, front),
        metrics_need_admin=settings.metrics_need_admin,
        body_timeout_s=settings.body_timeout_s,
        max_body_reads=settings.max_body_reads,
        pd=pd_role(getattr(server_args, "disaggregation_mode", None),
                   getattr(server_args, "disaggregation_transfer_backend", None)),
    )  # fmt: skip
    front.rates = rates
    state.set_current(front)
    routes.add_iso_routes(http_server.app, tokenizer_manager, front)
    lora.prewarm(tokenizer_manager, front.adapter_versions)
    reload.install_reload(keys, front)
    logger.info("sglang-iso: tenant gate installed for %d tenants", len(config.tenants))


def _tenant_limit(front: state.FrontState, tenant_id: str) -> int | None:
    tenant = front.config.tenants.get(tenant_id)
    return tenant.max_concurrent_requests if tenant is not None else None


def _tenant_queue(front: state.FrontState, tenant_id: str) -> int:
    tenant = front.config.tenants.get(tenant_id)
    return tenant.max_queued_requests if tenant is not None else 0


def _tenant_rates(front: state.FrontState, tenant_id: str) -> RateLimits:
    tenant = front.config.tenants.get(tenant_id)
    if tenant is None:
        return RateLimits()
    return RateLimits(tenant.requests_per_minute, tenant.tokens_per_minute)


def _token_counter(tokenizer_manager: Any) -> Callable[[str], int] | None:
    """The served tokenizer's token count of a text (for token reservations); None without a tokenizer."""
    tokenizer = getattr(tokenizer_manager, "tokenizer", None)
    encode = getattr(tokenizer, "encode", None)
    if encode is None:
        logger.warning("sglang-iso: no tokenizer in the HTTP process; token reservations estimate from bytes")
        return None
    return lambda text: len(encode(text))


def _model_limits(tokenizer_manager: Any) -> Limits | None:
    """Vocabulary size and context length of the served model, for the gate's bounds."""
    model_config = getattr(tokenizer_manager, "model_config", None)
    vocab = getattr(model_config, "vocab_size", None)
    context = getattr(tokenizer_manager, "context_len", None)
    if not isinstance(vocab, int) or not isinstance(context, int):
        logger.error("sglang-iso: model limits unknown; token ids and budgets are left to SGLang's checks")
        return None
    return Limits(vocab_size=vocab, context_len=context)
