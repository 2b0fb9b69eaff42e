"""Choose between the Triton and torch implementations of a kernel."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


def triton_interpreting() -> bool:
    """True when ``TRITON_INTERPRET=1``: Triton kernels then run on CPU tensors in the interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


@functools.cache
def triton_available() -> bool:
    """True when the ``triton`` package can be imported (it is not imported here; the answer is cached:
    the lookup walks ``sys.path`` and this runs on every forward)."""
    return importlib.util.find_spec("triton") is not None


def resolve_use_triton(use_triton: bool | None, device: torch.device, arg_name: str = "use_triton") -> bool:
    """Decide whether to run the Triton kernel for tensors on ``device``.

    ``None`` picks Triton on CUDA and torch anywhere else. On CPU the interpreter (``TRITON_INTERPRET=1``) runs a
    kernel only when asked for (``True``: the kernel tests): a server interpreting SGLang's own Triton kernels there
    would otherwise interpret these too, before every forward (measured: 4.6 % of a hybrid model's scheduler
    samples for the owner check alone).

    Raises:
        ValueError: ``use_triton`` is True but Triton is missing, or the tensors are on CPU without
            ``TRITON_INTERPRET=1``, or on a device Triton does not target.
    """
    runnable = triton_available() and (device.type == "cuda" or (device.type == "cpu" and triton_interpreting()))
    if use_triton is None:
        return runnable and device.type == "cuda"
    if use_triton and not runnable:
        raise ValueError(
            f"{arg_name}=True but Triton cannot run on device {device} (triton installed: {triton_available()}, "
            f"TRITON_INTERPRET set: {triton_interpreting()}); valid: use_triton=False or None"
        )
    return bool(use_triton)
