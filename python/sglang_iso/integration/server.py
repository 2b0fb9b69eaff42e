"""Starting the unmodified SGLang HTTP server (scheduler, allocator, tokenizer manager)."""

from __future__ import annotations

import argparse
import os
from typing import Any


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
    server_args: Any = prepare_server_args(sglang_argv)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
