"""Operator-declared shared prefixes: tokenized in the scheduler, declared in the tree.

The prefix is tokenized with the server's own tokenizer, the way the request
path will tokenize it: ``text`` with plain encoding (no special tokens added),
``messages`` rendered with the model's chat template. The declared tokens are
cut to whole pages; for ``text`` the last token is dropped too, because byte-level
BPE may merge it with whatever a request puts after the prefix. With an EAGLE-style
draft head the tree is keyed by token pairs, and so is the declaration (one entry fewer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal

from sglang_iso.cache import TenantRadixTree
from sglang_iso.names import shared_prefix_key
from sglang_iso.tenancy.config import TenantsConfig

logger = logging.getLogger(__name__)

SCOPE = "model"  # one base model per server; LoRA namespaces get a scope per adapter load (TenantRadixCache)


def declare_shared_prefixes(
    tree: TenantRadixTree,
    config: TenantsConfig,
    tokenizer: Any,
    page_size: int,
    tree_key: Callable[[list[int]], Sequence[int] | None] = list,
) -> int:
    """Declare every shared prefix of ``config``; returns how many were declared.

    ``tree_key`` turns tokens into the tree's key (the cache's own rule: token pairs with an EAGLE-style
    draft head). A prefix shorter than one page after cutting is skipped with a warning.
    Readers are namespace owners: listed tenants, and cache groups all of whose
    members are listed (a group shares one namespace).
    """
    declared = 0
    for prefix in config.shared_prefixes:
        if prefix.messages is not None:
            messages = [{"role": m.role, "content": m.content} for m in prefix.messages]
            rendered = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
            # NOTE: newer transformers return a BatchEncoding here, older ones a list of ids.
            tokens = _ids(rendered["input_ids"] if hasattr(rendered, "keys") else rendered, prefix.name)
        else:
            tokens = _ids(tokenizer.encode(prefix.text or "", add_special_tokens=False), prefix.name)[:-1]
        key = tree_key(tokens)
        tokens = list(key[: len(key) - len(key) % page_size]) if key is not None else []
        if not tokens:
            logger.warning("sglang-iso: shared prefix %r is shorter than one page; not declared", prefix.name)
            continue
        tree.declare_shared(shared_prefix_key(prefix.name), tokens, _readers(config, prefix.tenants), scope=SCOPE)
        declared += 1
        logger.info("sglang-iso: shared prefix %r declared (%d tokens)", prefix.name, len(tokens))
    return declared


def _ids(value: Any, name: str) -> list[int]:
    ids = list(value)
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = ids[0]
    if not all(isinstance(t, int) for t in ids):
        raise ValueError(f"shared prefix {name!r}: the tokenizer returned {type(value).__name__}, not token ids")
    return ids


def _readers(config: TenantsConfig, tenants: Any) -> frozenset[str] | Literal["*"]:
    if tenants == "*":
        return "*"
    listed = frozenset(tenants)
    owners = {t.id for t in config.tenants.values() if t.group is None and t.id in listed}
    groups: dict[str, list[str]] = {}
    for t in config.tenants.values():
        if t.group is not None:
            groups.setdefault(t.group, []).append(t.id)
    owners |= {g for g, members in groups.items() if all(m in listed for m in members)}
    return frozenset(owners)
