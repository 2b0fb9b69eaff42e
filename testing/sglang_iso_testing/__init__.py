"""sglang-iso's test harness, shared by the tests, the benchmarks and the demo.

Nothing here runs inside a server: the runtime package ``sglang_iso`` never imports
this one (only the ``sglang-iso demo`` command dispatches to :mod:`.demo`).

- :mod:`.process`: start a server as a child process, wait for /health, stop its whole process group.
- :mod:`.routing`: sglang-router in front of workers (command line, readiness).
- :mod:`.leak_fuzzer`: the seeded multi-tenant workload with leak oracles (security tests, long fuzz runs).
- :mod:`.lora_adapter`: a tiny seeded LoRA adapter for the bundled model.
- :mod:`.demo`: ``make demo`` / ``sglang-iso demo``.
"""
