# sglang-iso server image.
#
#   docker build -t ghcr.io/example/sglang-iso:0.1.0 .
#
# Installs with the semantics of scripts/install.sh: the exact runtime package set with --no-deps
# (pip's resolver cannot install sglang on a CPU-only machine), then sglang-iso itself in editable
# mode from /opt/sglang-iso (so the bundled tiny model lives at
# /opt/sglang-iso/python/sglang_iso/models/tiny-llama). Test and lint tools (requirements/dev.txt)
# are not installed.
#
# requirements/runtime.txt pins the CPU build of torch (2.13.0+cpu), which is published on the
# PyTorch CPU index, hence TORCH_INDEX_URL. The GPU image (the gpu overlay's tag) installs the pinned CUDA
# set, requirements/cuda.txt (CPython 3.12, torch 2.14.1 with CUDA 13 from PyPI; test/deploy/test_cuda_set.py
# checks that pip resolves exactly that set for Linux x86_64), on a Python 3.12 base:
#   docker build -t ghcr.io/example/sglang-iso:0.1.0-cuda \
#     --build-arg BASE_IMAGE=python:3.12.12-slim-bookworm \
#     --build-arg RUNTIME_REQUIREMENTS=requirements/cuda.txt --build-arg TORCH_INDEX_URL=https://pypi.org/simple .
# (make image-gpu runs it; make image builds the CPU one.)
ARG BASE_IMAGE=python:3.11.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG RUNTIME_REQUIREMENTS=requirements/runtime.txt
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG APP_UID=10001

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/sglang \
    XDG_CACHE_HOME=/home/sglang/.cache \
    HF_HOME=/home/sglang/.cache/huggingface \
    TRITON_CACHE_DIR=/home/sglang/.cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/home/sglang/.cache/torchinductor \
    OUTLINES_CACHE_DIR=/home/sglang/.cache/outlines

RUN groupadd --system --gid "${APP_UID}" sglang \
 && useradd --system --uid "${APP_UID}" --gid "${APP_UID}" --home-dir /home/sglang --create-home \
      --shell /usr/sbin/nologin sglang

WORKDIR /opt/sglang-iso

# Dependencies first, so source edits do not invalidate this (large) layer.
COPY requirements/ requirements/
RUN python -m pip install --no-deps --extra-index-url "${TORCH_INDEX_URL}" -r "${RUNTIME_REQUIREMENTS}"

COPY pyproject.toml README.md ./
COPY python/ python/
COPY sgl-kernel-patches/ sgl-kernel-patches/
COPY scripts/ scripts/
RUN python -m pip install --no-deps -e . \
 && python -m sglang_iso.cli cpu-hook install \
 && python - <<'PY'
# Same smoke check as scripts/install.sh: the plugin is discoverable and `import sglang` works (CPU hook).
from importlib.metadata import entry_points
names = [ep.name for ep in entry_points(group="sglang.srt.plugins")]
assert "sglang_iso" in names, f"sglang-iso plugin not registered: {names}"
import sglang  # noqa: F401
import sglang.srt.mem_cache.registry  # noqa: F401
import sglang_iso_kernels  # noqa: F401  (scrub and owner-check kernels; pyproject maps them to sgl-kernel-patches/)
print("sglang-iso installed")
PY

USER ${APP_UID}:${APP_UID}
EXPOSE 30000
# Worker: `sglang-iso serve ARGS`. The router container of deploy/ overrides the command.
ENTRYPOINT ["sglang-iso", "serve"]
