"""The OpenAI Python SDK against sglang-iso, as one tenant: chat, streaming chat, completions.

The tenant key is the SDK's ``api_key``; a wrong key raises ``openai.AuthenticationError`` (401),
an admin key on a generation endpoint ``openai.PermissionDeniedError`` (403).

    # against `sglang-iso demo --keep-running --port 30000` (no tenants file: any key is accepted)
    .venv/bin/python examples/openai_tenant.py --url http://127.0.0.1:30000
    # against a server started with --tenants-file
    SGLANG_ISO_URL=http://127.0.0.1:30000 SGLANG_ISO_API_KEY=sk-iso-... .venv/bin/python examples/openai_tenant.py

Start the server with ``--enable-cache-report`` to see ``usage.prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import argparse
import os

from openai import OpenAI

DEFAULT_URL = "http://127.0.0.1:30000"
SYSTEM = "You are the support assistant of Example Corp. Answer briefly."


def client(url: str, api_key: str, *, timeout_s: float = 120.0) -> OpenAI:
    # NOTE: max_retries=0 so that a wrong key fails at once instead of being retried.
    return OpenAI(base_url=url.rstrip("/") + "/v1", api_key=api_key, timeout=timeout_s, max_retries=0)


def chat(c: OpenAI, question: str, *, max_tokens: int = 12) -> tuple[str, int]:
    """One chat completion; returns (text, cached prompt tokens)."""
    r = c.chat.completions.create(
        model="default",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=0,
    )
    details = r.usage.prompt_tokens_details if r.usage else None
    return r.choices[0].message.content or "", (details.cached_tokens or 0) if details else 0


def stream_chat(c: OpenAI, question: str, *, max_tokens: int = 12) -> tuple[list[str], str | None]:
    """A streaming chat completion; returns (content deltas in order, finish reason)."""
    stream = c.chat.completions.create(
        model="default", messages=[{"role": "user", "content": question}], max_tokens=max_tokens, stream=True
    )
    parts: list[str] = []
    finish_reason: str | None = None
    for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish_reason = choice.finish_reason or finish_reason
    return parts, finish_reason


def complete(c: OpenAI, prompt: str, *, max_tokens: int = 12) -> str:
    r = c.completions.create(model="default", prompt=prompt, max_tokens=max_tokens)
    return r.choices[0].text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("SGLANG_ISO_URL", DEFAULT_URL), help="server URL")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("SGLANG_ISO_API_KEY", "none"),
        help="tenant key (env SGLANG_ISO_API_KEY); any value for a server without --tenants-file",
    )
    args = parser.parse_args(argv)
    c = client(args.url, args.api_key)
    question = "My order has not arrived yet. What can I do?"
    for attempt in ("first", "repeated"):
        text, cached = chat(c, question)
        print(f"chat ({attempt}): {text!r} (cached prompt tokens: {cached})")
    parts, finish_reason = stream_chat(c, "Hello!")
    print(f"streamed chat: {len(parts)} chunks {''.join(parts)!r} (finish reason: {finish_reason})")
    print(f"completion: {complete(c, 'Once upon a time')!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
