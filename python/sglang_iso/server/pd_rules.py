"""Body rules for prefill/decode (PD) workers and their router (no SGLang import).

On a PD worker every generation request must say which transfer it belongs to
(``bootstrap_host``, ``bootstrap_room``): SGLang's scheduler does not survive a
request without them. Only the router may set these fields, so:

* a tenant's own request to a PD worker is refused with 400 naming the field
  (the ``fake`` decode backend, which invents rooms itself, is the exception);
* the router authenticates with its own key (``router_key_sha256``) and forwards
  for one tenant, named by the request id prefix ``<tenant>.`` that the router's
  front gate (``sglang-iso router``) gave it. The worker re-checks that prefix and
  that the bootstrap fields are well formed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key")
REQUIRED_BOOTSTRAP = ("bootstrap_host", "bootstrap_room")
GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions", "/v1/responses"})
# Paths the router's key may call: generation, and what the router reads when it registers a worker.
ROUTER_TENANT_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
ROUTER_INFO_PATHS = frozenset({"/server_info", "/get_server_info", "/model_info", "/get_model_info", "/v1/models"})
MAX_ROOM = 2**63 - 1
"""Largest bootstrap room (SGLang stores rooms in a signed 64-bit tensor on some backends)."""


@dataclass(frozen=True)
class PdRole:
    """This worker's place in a PD deployment (``--disaggregation-mode``, ``--disaggregation-transfer-backend``)."""

    mode: str
    """``"prefill"`` or ``"decode"``."""
    backend: str
    """The transfer backend (``"mooncake"``, ``"fake"``, ...)."""

    @property
    def needs_bootstrap(self) -> bool:
        """True unless SGLang assigns rooms itself (a ``fake`` decode worker, which moves no KV)."""
        return not (self.mode == "decode" and self.backend == "fake")


class PdRefusal(NamedTuple):
    """Why a PD request is refused: the offending field and why."""

    field: str
    reason: str


def pd_role(mode: object, backend: object) -> PdRole | None:
    """The worker's role, or None when the server is not disaggregated."""
    if mode in (None, "null", "") or not isinstance(mode, str):
        return None
    return PdRole(str(mode), str(backend or "mooncake"))


def router_tenant(obj: dict[str, Any]) -> str | PdRefusal:
    """The tenant a router request is forwarded for: the ``<tenant>.`` prefix of every request id."""
    value = obj.get("rid", obj.get("request_id"))
    rids = value if isinstance(value, list) else [value]
    tenants = {r.split(".", 1)[0] for r in rids if isinstance(r, str) and "." in r}
    if len(tenants) != 1 or not all(isinstance(r, str) and "." in r for r in rids):
        return PdRefusal("rid", "a router request must carry request ids prefixed with one tenant id ('<tenant>.')")
    return tenants.pop()


def check_bootstrap(obj: dict[str, Any], role: PdRole | None, path: str, *, from_router: bool) -> PdRefusal | None:
    """Refuse a body whose bootstrap fields do not fit this worker and this caller.

    Tenants never get here with bootstrap fields (they are forbidden fields); the
    router must send them, well formed, to a worker that needs them.
    """
    if role is None or not role.needs_bootstrap or path not in GENERATION_PATHS:
        return None
    for field in REQUIRED_BOOTSTRAP:
        if obj.get(field) is None:
            who = "the router did not set it" if from_router else "send requests through the PD router"
            return PdRefusal(field, f"is required on a {role.mode} worker ({who})")
    if not from_router:
        return PdRefusal("bootstrap_room", "may only be set by the PD router")
    if not _all(obj["bootstrap_host"], lambda v: isinstance(v, str) and 0 < len(v) <= 255):
        return PdRefusal("bootstrap_host", "must be a host name (or a list of them for a batch)")
    if not _all(obj["bootstrap_room"], lambda v: type(v) is int and 0 < v <= MAX_ROOM):
        return PdRefusal("bootstrap_room", f"must be an integer in [1, {MAX_ROOM}] (or a list of them)")
    port = obj.get("bootstrap_port")
    if port is not None and not _all(port, lambda v: type(v) is int and 0 < v < 65536):
        return PdRefusal("bootstrap_port", "must be a port number (or a list of them)")
    return None


def _all(value: object, ok: Any) -> bool:
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(ok(v) for v in items)
