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

sglang-router re-serializes OpenAI chat requests through its own schema, which has
no ``rid``: for those the front gate also sends the id as ``X-Request-ID``, which
the router forwards as it came, and the worker takes the id from that header
when the body has none (:func:`router_rid_header`).

SGLang gives every parallel sample of a request (``n > 1``) the request's one
transfer room, so such a request hangs a PD pair until it times out; a worker
refuses it (400 naming ``n``) and the front gate sends one request per sample.
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
REQUEST_ID_HEADER = "x-request-id"
"""Header sglang-router forwards to both workers unchanged; carries the request id of a chat request."""
MAX_HEADER_RID_CHARS = 512
"""Longest request id taken from ``X-Request-ID`` (the front gate's ids are far shorter)."""
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


def router_rid_header(obj: dict[str, Any], header: str | None) -> bool:
    """Move the ``X-Request-ID`` value into a router request body without ids; True if the body changed.

    Mutates: ``obj["rid"]`` when the body has neither ``rid`` nor ``request_id`` and ``header`` is a plausible id.
    """
    if obj.get("rid") is not None or obj.get("request_id") is not None or not header:
        return False
    if len(header) > MAX_HEADER_RID_CHARS or not header.isprintable():
        return False
    obj["rid"] = header
    return True


def parallel_samples(obj: dict[str, Any]) -> tuple[str, int]:
    """The largest sample count a generation body asks for, and the field that asks (``n`` or ``sampling_params.n``).

    Values that are not integers count as 1 here; the body rules refuse them with their own message.
    """
    found = ("n", _count(obj.get("n")))
    params = obj.get("sampling_params")
    for index, p in enumerate(params if isinstance(params, list) else [params]):
        if isinstance(p, dict) and _count(p.get("n")) > found[1]:
            found = ("sampling_params.n" if not isinstance(params, list) else f"sampling_params[{index}].n", p["n"])
    return found


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
    field, samples = parallel_samples(obj)
    if samples > 1:
        return PdRefusal(
            field,
            "must be 1 on a prefill/decode worker (SGLang gives every sample one transfer room); "
            "the PD router's front gate sends one request per sample",
        )
    if not _all(obj["bootstrap_host"], lambda v: isinstance(v, str) and 0 < len(v) <= 255):
        return PdRefusal("bootstrap_host", "must be a host name (or a list of them for a batch)")
    if not _all(obj["bootstrap_room"], lambda v: type(v) is int and 0 < v <= MAX_ROOM):
        return PdRefusal("bootstrap_room", f"must be an integer in [1, {MAX_ROOM}] (or a list of them)")
    port = obj.get("bootstrap_port")
    if port is not None and not _all(port, lambda v: type(v) is int and 0 < v < 65536):
        return PdRefusal("bootstrap_port", "must be a port number (or a list of them)")
    return None


def _count(value: object) -> int:
    return value if type(value) is int else 1


def _all(value: object, ok: Any) -> bool:
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(ok(v) for v in items)
