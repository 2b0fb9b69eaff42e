"""``make demo`` / ``sglang-iso demo``: serve the bundled model and show a cache hit.

Starts the real SGLang server through sglang-iso's launcher, sends a prompt
twice (the second time ``meta_info.cached_tokens`` shows the prefix cache hit),
sends an OpenAI chat completion, prints everything and stops the server.
"""

from __future__ import annotations

import argparse
import sys
import time

from sglang_iso.models import tiny_model_path
from sglang_iso.server.process import ServerProcess, ServerStartError, free_port, iso_server_argv

PROMPT = (
    "You are the support assistant of Example Corp. Answer briefly and politely. "
    "Customer: my order has not arrived yet, what can I do?"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-iso demo", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="port to serve on (default: a free one)")
    parser.add_argument("--keep-running", action="store_true", help="leave the server running until Ctrl-C")
    args = parser.parse_args(argv)
    port = args.port or free_port()
    server = ServerProcess(iso_server_argv(port, tiny_model_path(), "--max-total-tokens", "16384"), port)
    print(f"starting sglang-iso on {server.base_url} (model: bundled tiny-llama; log: {server.log_path})")
    t0 = time.monotonic()
    try:
        server.start()
    except ServerStartError as exc:
        print(f"server failed to start:\n{exc}", file=sys.stderr)
        return 1
    try:
        print(f"ready in {time.monotonic() - t0:.1f}s")
        _, info = server.get("/get_server_info")
        tree = info["internal_states"][0]["sglang_iso"]["tree_cache"]
        print(f"live tree cache: {tree['impl']} (backend {tree['backend']!r})")
        request = {"text": PROMPT, "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
        for attempt in ("first", "repeated"):
            status, out = server.post("/generate", request)
            if status != 200:
                print(f"/generate failed ({status}): {out}", file=sys.stderr)
                return 1
            meta = out["meta_info"]
            print(f"\n/generate ({attempt} request)")
            print(f"  output:        {out['text']!r}")
            print(f"  prompt tokens: {meta['prompt_tokens']}, cached tokens: {meta['cached_tokens']}")
        status, chat = server.post(
            "/v1/chat/completions",
            {"model": "default", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 12},
        )
        if status != 200:
            print(f"/v1/chat/completions failed ({status}): {chat}", file=sys.stderr)
            return 1
        print("\n/v1/chat/completions")
        print(f"  output: {chat['choices'][0]['message']['content']!r}")
        print(f"  usage:  {chat['usage']}")
        print("\n(the bundled model has random weights: its text is gibberish by design)")
        if meta["cached_tokens"] <= 0:
            print("expected a cache hit on the repeated request, got none", file=sys.stderr)
            return 1
        print(f"cache hit on the repeated request: {meta['cached_tokens']} of {meta['prompt_tokens']} prompt tokens")
        if args.keep_running:
            print(f"\nserving on {server.base_url}; Ctrl-C to stop")
            try:
                while server.proc is not None and server.proc.poll() is None:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
