"""The front end (HTTP / tokenizer-manager process) with a tenants file, one module per concern.

- :mod:`.state`: the process's tenant state (config, namespace tagger, weights generation, internal key).
- :mod:`.gate`: installs the tenant gate, the /iso/* routes and the SIGHUP reload before SGLang serves.
- :mod:`.gc_freeze`: SGLang's post-start garbage-collector freeze, through the gate.
- :mod:`.reload`: SIGHUP reloads the tenants file.
- :mod:`.routes`: the admin routes ``/iso/*`` (their scheduler side: :mod:`sglang_iso.integration.commands`).
- :mod:`.tagging`: every request gets its tenant's namespace tag (and its outputs are observed).
- :mod:`.metrics`: per-tenant metrics and audit records from a request's final outputs.
- :mod:`.weights`: a weight update changes every later namespace and drops the old entries.

Their hooks are rows of :mod:`sglang_iso.integration.hook_table` (``Required.TENANTS_FILE``: with a tenants file
the launcher refuses to serve unless all were applied).
"""
