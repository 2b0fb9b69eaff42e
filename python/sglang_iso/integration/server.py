"""Starting the unmodified SGLang HTTP server (scheduler, allocator, tokenizer manager)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from sglang_iso.settings import current as current_settings


def add_sglang_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add every SGLang server flag, exactly as ``sglang serve`` defines them."""
    from sglang.srt.server_args import ServerArgs

    ServerArgs.add_cli_args(parser)


def serve(sglang_argv: list[str]) -> None:
    """Load plugins, parse ``sglang_argv`` with SGLang's parser and serve until shutdown."""
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    _require_frontend_hooks()
    server_args: Any = prepare_server_args(sglang_argv)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def _require_frontend_hooks() -> None:
    """With a tenants file, refuse to serve if the gate or tagging hooks were not applied.

    Raises:
        RuntimeError: naming the hooks that are missing.
    """
    from sglang_iso.integration import hook_table

    if current_settings().tenants_file is None:
        return
    missing = hook_table.missing(required=hook_table.Required.TENANTS_FILE)
    if missing:
        raise RuntimeError(f"sglang-iso: tenant front-end hooks were not applied: {missing}; refusing to serve")
