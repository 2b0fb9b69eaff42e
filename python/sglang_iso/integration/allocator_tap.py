"""One wrapping of the KV allocator's and the row pool's methods, shared by every defense that needs them.

The scrubber, the owner table and the PD quarantine all act when slots are released, handed out or the
pool is cleared. Each subscribes a *layer* to a method of the instance's :class:`Tap`; the tap replaces
the method once and calls the layers in :class:`Order`, outermost first, whatever order they subscribed
in. A layer is an AROUND: ``layer(below, *args)`` decides what ``below`` (the next layer, finally the
SGLang method) receives, and whether it is called at all.

    allocator release (page 1: ``free``; paged: ``_release_page_ids``)
        QUARANTINE  PD: pages a transfer may still use are held back    (pd_transfer.py)
        OWNER       the zero page is never released; pages become FREE  (owner_check.py)
        SCRUB       released pages recorded, zeroed before next hand-out (scrub.py)
        -> SGLang
    allocator ``clear``:  QUARANTINE (fenced pages kept out), OWNER (fresh zero page), then SGLang
    allocator hand-out (``alloc``, ``alloc_extend``, ``alloc_decode``):  SCRUB (zero pending pages first)
    row pool ``free_rows``:  OWNER (row owner FREE), SCRUB (row reset to the padding slot), then SGLang
    row pool ``alloc``:  OWNER (each new row's owner recorded)

Scheduler thread only.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

Layer = Callable[..., Any]
"""``layer(below, *args, **kwargs)``: the method's arguments, and ``below`` to call the rest of the chain."""

RELEASE = "release"
"""The allocator's release method, whichever its name (``allocator_release_name``)."""

_ATTR = "_sglang_iso_tap"  # NOTE: kept on the SGLang instance because a tap belongs to exactly one instance


class Order(enum.IntEnum):
    """Where a subscriber's layer sits; lower is outer (runs first, sees the arguments first)."""

    QUARANTINE = 10
    OWNER = 20
    SCRUB = 30


class Tap:
    """The layers subscribed to the methods of one SGLang object (an allocator or a row pool)."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self._originals: dict[str, Callable[..., Any]] = {}  # attribute name -> the SGLang method
        self._layers: dict[str, list[tuple[Order, Layer]]] = {}  # attribute name -> layers, outermost first
        self._chains: dict[str, list[Callable[..., Any]]] = {}
        """Attribute name -> ``chain[i]``: layer ``i`` bound to ``chain[i + 1]``, the last one the SGLang method
        (built once per subscription, so a call makes no partials of its own)."""

    def subscribe(self, method: str, order: Order, layer: Layer) -> None:
        """Put ``layer`` on ``method`` (``RELEASE`` names the allocator's release) at ``order``.

        Raises:
            ValueError: ``order`` already has a layer on this method (each subscriber subscribes once).
        """
        name = allocator_release_name(self.target) if method == RELEASE else method
        layers = self._layers.setdefault(name, [])
        if any(o == order for o, _ in layers):
            raise ValueError(f"{type(self.target).__name__}.{name}: {order.name} is already subscribed")
        layers.append((order, layer))
        layers.sort(key=lambda entry: entry[0])
        if name not in self._originals:
            self._wrap(name)
        self.rebuild(name)

    def call_below(self, method: str, order: Order, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` through the layers below ``order`` only (a subscriber releasing what it held back)."""
        name = allocator_release_name(self.target) if method == RELEASE else method
        layers = self._layers.get(name, [])
        start = next((i for i, (o, _) in enumerate(layers) if o > order), len(layers))
        return self._call(name, start, *args, **kwargs)

    def orders(self, method: str) -> list[Order]:
        """The orders subscribed to ``method``, outermost first."""
        name = allocator_release_name(self.target) if method == RELEASE else method
        return [o for o, _ in self._layers.get(name, [])]

    def rebuild(self, name: str) -> None:
        """Bind ``name``'s layers into its call chain again (after its layers or its SGLang method changed)."""
        below = self._originals[name]
        chain = [below]
        for _, layer in reversed(self._layers[name]):
            below = functools.partial(layer, below)
            chain.append(below)
        self._chains[name] = chain[::-1]

    def _wrap(self, name: str) -> None:
        original = getattr(self.target, name)
        self._originals[name] = original
        chains = self._chains

        @functools.wraps(original)
        def tapped(*args: Any, **kwargs: Any) -> Any:
            return chains[name][0](*args, **kwargs)

        setattr(self.target, name, tapped)

    def _call(self, name: str, index: int, *args: Any, **kwargs: Any) -> Any:
        return self._chains[name][index](*args, **kwargs)


def tap_of(target: Any) -> Tap:
    """The tap of an allocator or row pool instance, made on first use."""
    tap = target.__dict__.get(_ATTR)
    if tap is None:
        tap = Tap(target)
        setattr(target, _ATTR, tap)
    return tap


def is_paged(allocator: Any) -> bool:
    """Paged allocators end every free in ``_release_page_ids(*page_ids)`` (page ids); page-1 ones in
    ``free(free_index)`` (slot indices)."""
    return hasattr(allocator, "_release_page_ids")


def allocator_release_name(allocator: Any) -> str:
    return "_release_page_ids" if is_paged(allocator) else "free"


# ------------------------------------------------------------------ the owner tables' release layers

FREE_PAGE = -1
"""The owner of a page no request or tree node holds (the owner tables' FREE)."""


def release_pages(
    page_owner: torch.Tensor,
    zero_page: int,
    below: Any,
    *page_ids: torch.Tensor,
    released: Callable[[np.ndarray], None] | None = None,
) -> Any:
    """AROUND a paged allocator's ``_release_page_ids``: released pages become FREE in ``page_owner``; the zero page
    is never released (a row slot replaced by it must not free it). ``released`` is told the pages made FREE."""
    page_ids = tuple(p[p != zero_page] for p in page_ids)
    for pages in page_ids:
        page_owner[pages.to(torch.int64)] = FREE_PAGE
        if released is not None and pages.numel():
            released(pages.cpu().numpy())
    return below(*page_ids)


def release_slots(
    page_owner: torch.Tensor,
    zero_page: int,
    page_size: int,
    allocator: Any,
    below: Any,
    *args: Any,
    released: Callable[[np.ndarray], None] | None = None,
) -> Any:
    """AROUND a page-1 allocator's ``free(slots)``: as :func:`release_pages`, by slot (a grouped free is marked FREE
    when the group ends, through this same method)."""
    if args and args[0].numel():
        slots = args[0]
        if slots.device.type == "cpu" and page_owner.device.type == "cpu":
            # NOTE: numpy views of the same memory: a few array operations instead of six torch ones (every free).
            pages = slots.numpy() // page_size
            keep = pages != zero_page
            if not keep.all():
                args, pages = (slots[torch.from_numpy(keep)], *args[1:]), pages[keep]
            if allocator.free_group is None:
                page_owner.numpy()[pages] = FREE_PAGE
                if released is not None:
                    released(pages)
            return below(*args)
        args = (slots[slots // page_size != zero_page], *args[1:])
        if allocator.free_group is None:
            pages_t = args[0].to(torch.int64) // page_size
            page_owner[pages_t] = FREE_PAGE
            if released is not None:
                released(pages_t.cpu().numpy())
    return below(*args)
