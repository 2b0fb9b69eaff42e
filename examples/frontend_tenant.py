"""SGLang's frontend language against sglang-iso, as one tenant.

Every construct talks to the server through ``sgl.RuntimeEndpoint(url, api_key=<tenant key>)``:
chat roles with ``gen``, ``select``, ``fork``/``join``, streaming and ``run_batch``. The tenant key
is sent as ``Authorization: Bearer`` on every request, so the server places everything this program
caches (the forked document below, for instance) in this tenant's namespace only.

    # against `sglang-iso demo --keep-running --port 30000` (no tenants file: no key needed)
    .venv/bin/python examples/frontend_tenant.py --url http://127.0.0.1:30000
    # against a server started with --tenants-file
    SGLANG_ISO_URL=http://127.0.0.1:30000 SGLANG_ISO_API_KEY=sk-iso-... .venv/bin/python examples/frontend_tenant.py

The bundled model has random weights: generated text is gibberish, ``select`` still picks one of
its choices (it scores them by log-probability).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import sglang as sgl

DEFAULT_URL = "http://127.0.0.1:30000"


def connect(url: str, api_key: str | None) -> sgl.RuntimeEndpoint:
    """A backend for ``url``; raises RuntimeError (with the server's JSON error) on a bad key.

    ``RuntimeEndpoint`` calls ``GET /get_model_info`` here, which sglang-iso allows for tenant keys.
    """
    return sgl.RuntimeEndpoint(url, api_key=api_key)


@sgl.function
def support_turn(s, question: str, max_tokens: int = 8):
    """Chat roles: system, user, then the assistant's answer (variable ``answer``)."""
    s += sgl.system("You are the support assistant of Example Corp. Answer briefly.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=max_tokens, temperature=0))


@sgl.function
def triage(s, ticket: str):
    """``select``: the server scores each choice; variable ``label`` is one of them."""
    s += f"Ticket: {ticket}\nCategory: " + sgl.select("label", choices=["billing", "shipping", "other"])


@sgl.function
def review(s, document: str, questions: list[str]):
    """``fork``/``join`` over one long shared document.

    The fork first sends the document alone (``max_new_tokens`` 0), so the server caches it; each
    branch then continues the same prefix and reuses that cache entry (``cached_tokens`` in its
    meta info). Returns the branches' meta infos (``state.ret_value``).
    """
    s += "Document: " + document + "\n"
    # NOTE: sync first. SGLang 0.5.23's fork decides whether to send the shared prefix ahead by looking
    # at the text *before* draining the executor queue; without this sync it often sees an empty text,
    # skips that request, and the branches prefill the document in parallel, none reusing the others.
    s.sync()
    branches = s.fork(len(questions))
    for branch, question in zip(branches, questions, strict=True):
        branch += f"Q: {question}\nA: " + sgl.gen("answer", max_tokens=4, temperature=0)
    # NOTE: the default join ("gather_variable") copies the branch variables back as a list.
    # join("concate_and_append") would call the admin-only /concate_and_append_request (examples/README.md).
    branches.join()
    s += "Summary: " + sgl.gen("summary", max_tokens=4, temperature=0)
    return [branch.get_meta_info("answer") for branch in branches]


def run_all(backend: sgl.RuntimeEndpoint, document: str | None = None) -> dict[str, Any]:
    """Run every construct once; returns what each produced."""
    turn = support_turn.run(question="My order has not arrived yet. What can I do?", backend=backend)
    label = triage.run(ticket="I was charged twice for one order.", backend=backend)["label"]
    streamed = "".join(support_turn.run(question="Hello!", stream=True, backend=backend).text_iter("answer"))
    batch = support_turn.run_batch(
        [{"question": "Where is my parcel?"}, {"question": "Can I change my address?"}],
        backend=backend,
        num_threads=2,
    )
    document = document or " ".join(
        f"Clause {i}: the customer may return goods within {i + 14} days." for i in range(20)
    )
    reviewed = review.run(
        document=document, questions=["Who may return goods?", "Within how many days?"], backend=backend
    )
    return {
        "answer": turn["answer"],
        "roles": [m["role"] for m in turn.messages()],
        "label": label,
        "streamed": streamed,
        "batch": [state["answer"] for state in batch],
        "fork_answers": reviewed["answer"],
        "fork_meta": reviewed.ret_value,
        "summary": reviewed["summary"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("SGLANG_ISO_URL", DEFAULT_URL), help="server URL")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("SGLANG_ISO_API_KEY"),
        help="tenant key (env SGLANG_ISO_API_KEY); omit for a server without --tenants-file",
    )
    args = parser.parse_args(argv)
    out = run_all(connect(args.url, args.api_key))
    print(f"chat ({' -> '.join(out['roles'])}): {out['answer']!r}")
    print(f"select: {out['label']!r}")
    print(f"stream: {out['streamed']!r}")
    print(f"run_batch: {out['batch']!r}")
    print(f"fork answers: {out['fork_answers']!r}, summary: {out['summary']!r}")
    for i, meta in enumerate(out["fork_meta"]):
        print(f"  branch {i}: {meta['cached_tokens']} of {meta['prompt_tokens']} prompt tokens from the cache")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
