"""The front end (HTTP / tokenizer-manager process) with a tenants file, one module per concern.

- :mod:`.state`: the process's tenant state (config, namespace tagger, weights generation); the only global.
- :mod:`.gate`: installs the tenant gate, the /iso/* routes and the SIGHUP reload before SGLang serves.
- :mod:`.reload`: SIGHUP reloads the tenants file.
- :mod:`.routes`: ``GET /iso/tenants``, ``POST /iso/flush``, ``GET /iso/check`` (admin-only).
- :mod:`.tagging`: every request gets its tenant's namespace tag (and its outputs are observed).
- :mod:`.metrics`: per-tenant metrics and audit records from a request's final outputs.
- :mod:`.weights`: a weight update changes every later namespace and drops the old entries.

:mod:`sglang_iso.integration.frontend` registers the hooks.
"""
