"""Front-end (HTTP/tokenizer-manager process) settings: the tenant gate and namespace tags.

Active only when the launcher passed a tenants file (``TENANTS_FILE_ENV``). Each concern lives in
:mod:`sglang_iso.integration.front`; its hooks are rows of :mod:`sglang_iso.integration.hook_table`
(``Required.TENANTS_FILE``: with a tenants file the launcher refuses to serve unless all were applied).
"""

from __future__ import annotations

from sglang_iso import envvars
from sglang_iso.integration.front.gate import tenants_config

__all__ = ["METRICS_AUTH_ENV", "TENANTS_FILE_ENV", "tenants_config"]

TENANTS_FILE_ENV = envvars.TENANTS_FILE.name
METRICS_AUTH_ENV = envvars.METRICS_AUTH.name  # "admin" (default) or "open"
