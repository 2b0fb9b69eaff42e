"""OpenAI ``n > 1`` through the PD router: one request per sample, answers merged back (no SGLang import).

SGLang 0.5.23 gives every parallel sample of a disaggregated request the request's
one transfer room, so the samples wait on each other's transfer until the router
times out. The PD router's front gate therefore splits a chat or completions
request with ``n = N`` into N requests with ``n = 1`` (each gets its own rooms from
sglang-router and its own request id ``<rid>_<i>`` in the tenant's id space) and
merges what comes back into the one answer the client asked for::

    choice index = prompt index * N + sample index      (OpenAI's order for a batch of prompts with n)

Usage: the prompt is counted once (the first sample's ``prompt_tokens`` and its
details), completion tokens are summed over the samples.
"""

from __future__ import annotations

import copy
import json
from typing import Any

SAMPLE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
"""OpenAI routes whose ``n`` the front gate splits."""


def sample_count(path: str, obj: dict[str, Any]) -> int:
    """How many requests ``obj`` becomes: its ``n`` on an OpenAI route (1 for anything else or a bad value)."""
    n = obj.get("n")
    return n if path in SAMPLE_PATHS and type(n) is int and n > 1 else 1


def split(obj: dict[str, Any], samples: int, rid: str | list[str]) -> list[dict[str, Any]]:
    """``samples`` copies of ``obj`` with ``n = 1`` and request ids ``<rid>_<i>`` (per prompt for a list)."""
    out = []
    for i in range(samples):
        sub = copy.deepcopy(obj)
        sub["n"] = 1
        sub.pop("best_of", None)  # NOTE: SGLang serves best_of as n; each sample is one request here
        sub["rid"] = [f"{r}_{i}" for r in rid] if isinstance(rid, list) else f"{rid}_{i}"
        out.append(sub)
    return out


def merge(responses: list[dict[str, Any]], response_id: str) -> dict[str, Any]:
    """One non-streamed answer from the samples' answers, in sample order."""
    samples = len(responses)
    out = dict(responses[0])
    out["id"] = response_id
    choices: list[dict[str, Any]] = []
    for sample, response in enumerate(responses):
        for choice in response.get("choices") or []:
            if isinstance(choice, dict):
                choices.append({**choice, "index": _index(choice, samples, sample)})
    out["choices"] = sorted(choices, key=lambda c: int(c["index"]))
    usage = merge_usage([r.get("usage") for r in responses])
    if usage is not None:
        out["usage"] = usage
    return out


def merge_usage(usages: list[Any]) -> dict[str, Any] | None:
    """The prompt counted once (the first sample's), completion tokens summed; None without a first usage."""
    if not usages or not isinstance(usages[0], dict):
        return None
    out = dict(usages[0])
    completion = sum(int(u.get("completion_tokens") or 0) for u in usages if isinstance(u, dict))
    out["completion_tokens"] = completion
    out["total_tokens"] = int(out.get("prompt_tokens") or 0) + completion
    return out


class StreamMerger:
    """Merges the samples' server-sent events into one stream.

    Each sample's chunks pass through as they come, with the choice index of the
    merged answer and one response id; the samples' usage-only chunks and their
    ``[DONE]`` are held back and sent once, merged, when every sample has ended.
    Mutates only itself; one instance per client request.
    """

    def __init__(self, samples: int, response_id: str) -> None:
        self.samples = samples
        self.response_id = response_id
        self.usages: list[Any] = [None] * samples
        self.usage_chunk: dict[str, Any] | None = None

    def line(self, sample: int, raw: bytes) -> bytes | None:
        """The event to send for one line of sample ``sample``'s stream, or None (blank, held back, not data)."""
        text = raw.strip()
        if not text.startswith(b"data:"):
            return None
        data = text[len(b"data:") :].strip()
        if data == b"[DONE]":
            return None
        try:
            chunk = json.loads(data)
        except ValueError:
            return b"data: " + data + b"\n\n"
        if isinstance(chunk, dict) and isinstance(chunk.get("choices"), list):
            if not chunk["choices"] and chunk.get("usage") is not None:
                self.usages[sample] = chunk["usage"]
                self.usage_chunk = chunk
                return None
            chunk["id"] = self.response_id
            chunk["choices"] = [
                {**c, "index": _index(c, self.samples, sample)} if isinstance(c, dict) else c for c in chunk["choices"]
            ]
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    def finish(self) -> list[bytes]:
        """The held-back events: the merged usage chunk (if the samples sent usage), then ``[DONE]``."""
        out = []
        usage = merge_usage(self.usages)
        if usage is not None and self.usage_chunk is not None:
            out.append(b"data: " + json.dumps({**self.usage_chunk, "id": self.response_id, "usage": usage}).encode())
        out.append(b"data: [DONE]")
        return [event + b"\n\n" for event in out]


def _index(choice: dict[str, Any], samples: int, sample: int) -> int:
    prompt = choice.get("index")
    return (prompt if type(prompt) is int else 0) * samples + sample
