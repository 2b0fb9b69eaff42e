#!/usr/bin/env bash
# GPU check: the gpu-marked tests and the GPU benchmarks, in one run of under 8 minutes, results in one file.
#
#   bash scripts/gpu_check.sh [RESULTS_FILE]        # default: gpu_check_results.txt
#
# Steps (each bounded by its own timeout and by the overall budget, BUDGET_S, default 470 s):
#   env        GPU, driver, python, torch, triton versions (fails when CUDA is not available)
#   install    the CUDA package set (requirements/cuda.txt, pinned): skipped when sglang already imports or with
#              GPU_CHECK_INSTALL=0 (no package index: the kernel and benchmark steps still run); from WHEELS
#              (a folder of wheels, offline) when set; else pip with the package index
#   kernels    pytest test/kernels on the GPU: scrub kernel (slot pages and DSA index-key page rows), the
#              batched row check
#              (the speculative-op stand-ins too when sglang imports)
#   bench      benchmark/owner_check.py per-forward table (pool 64k..32M, batch 1..256) + PNG, and the scrub
#              kernel's bandwidth (benchmark/scrub.py --skip-serving)
#   server     pytest -m gpu test/e2e/test_owner_check.py: a FlashInfer server (CUDA graphs on) where a planted
#              foreign slot must read the zero page and abort the request, with its positive controls
#   serving    benchmark/owner_check.py serving part: upstream vs check off vs on at an 8M-slot pool
#   pd         test/e2e/test_pd.py on the GPU: router + prefill + decode, KV in GPU memory moved by Mooncake over
#              TCP on loopback (needs the CUDA build, pip mooncake-transfer-engine, and libibverbs1), forged tag,
#              aborted transfer kept quarantined; skipped when `mooncake.engine` does not import
# The server and serving steps need sglang with its CUDA kernels; without them they are recorded as SKIP.
#
# GPU_CHECK_CPU_SMOKE=1 runs the same flow on a machine without CUDA (tiny sizes; GPU tests are skipped there),
# to check the script itself.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RESULTS="${1:-gpu_check_results.txt}"
RESULTS_DIR="$(cd "$(dirname "$RESULTS")" && pwd)"
RESULTS="$RESULTS_DIR/$(basename "$RESULTS")"
PYTHON="${PYTHON:-python3}"
BUDGET_S="${BUDGET_S:-470}"
SMOKE="${GPU_CHECK_CPU_SMOKE:-0}"
export PYTHONPATH="$ROOT/python:$ROOT/testing:$ROOT/sgl-kernel-patches:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
START=$(date +%s)
PASS=0 FAIL=0 SKIP=0

: >"$RESULTS"
log() { printf '%s\n' "$*" | tee -a "$RESULTS"; }

# step NAME MAX_SECONDS COMMAND...: run with the smaller of its own limit and what is left of the budget.
step() {
  local name=$1 max=$2
  shift 2
  local left=$((BUDGET_S - ($(date +%s) - START)))
  local limit=$((max < left ? max : left))
  if [ "$limit" -lt 10 ]; then
    log "== $name: SKIP (budget of ${BUDGET_S}s spent)"
    SKIP=$((SKIP + 1))
    return 0
  fi
  log "== $name (limit ${limit}s): $*"
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >>"$RESULTS" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    log "== $name: PASS ($(($(date +%s) - t0))s)"
    PASS=$((PASS + 1))
  else
    [ "$rc" -eq 124 ] && log "== $name: timed out after ${limit}s"
    log "== $name: FAIL (exit $rc, $(($(date +%s) - t0))s)"
    FAIL=$((FAIL + 1))
  fi
}

skip() {
  log "== $1: SKIP ($2)"
  SKIP=$((SKIP + 1))
}

have_cuda() { "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
have_sglang() { "$PYTHON" -c 'import sglang, flashinfer, sgl_kernel' >/dev/null 2>&1; }

log "sglang-iso GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
step env 30 bash -c "nvidia-smi -L 2>/dev/null || echo 'nvidia-smi: not available'; \"$PYTHON\" -c '
import platform, torch
print(\"python\", platform.python_version(), \"torch\", torch.__version__, \"cuda\", torch.version.cuda)
print(\"cuda available:\", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"\")
try:
    import triton; print(\"triton\", triton.__version__)
except ImportError:
    print(\"triton: not installed\")
'"
if ! have_cuda && [ "$SMOKE" != 1 ]; then
  log "CUDA is not available: nothing to check (GPU_CHECK_CPU_SMOKE=1 checks the script on CPU)"
  log "SUMMARY: pass=$PASS fail=$((FAIL + 1)) skip=$SKIP"
  exit 1
fi

if have_sglang; then
  skip install "sglang, flashinfer and sgl_kernel already import"
elif [ -n "${WHEELS:-}" ]; then
  SITE="${TMPDIR:-/tmp}/sglang-iso-gpu-site"
  step install 150 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl
  export PYTHONPATH="$PYTHONPATH:$SITE"
elif [ "$SMOKE" = 1 ]; then
  skip install "CPU smoke run"
elif [ "${GPU_CHECK_INSTALL:-1}" = 0 ]; then
  skip install "GPU_CHECK_INSTALL=0 (a machine without a package index: kernel-level checks only)"
else
  step install 180 "$PYTHON" -m pip install -q -r requirements/cuda.txt
fi

PYTEST=("$PYTHON" -m pytest -q -p no:cacheprovider -o addopts= -m gpu)
# Every kernel test runs on the GPU (its tensors live on CUDA there, Triton compiled); the speculative-op and
# linear-attention stand-ins are compared with SGLang's own Triton kernels, so they need sglang.
KERNEL_TESTS=(test/kernels)
have_sglang || KERNEL_TESTS+=(--ignore=test/kernels/test_spec_cpu.py --ignore=test/kernels/test_linear_attn_cpu.py)
step kernels 150 "$PYTHON" -m pytest -q -p no:cacheprovider -o addopts= "${KERNEL_TESTS[@]}" -rs

if [ "$SMOKE" = 1 ]; then
  SIZES=(--pools 65536,1048576 --batches 1,16 --context 256 --repeats 2)
  SCRUB=(--layers 2 --pages 64 --page-size 16)
else
  SIZES=(--pools 65536,1048576,8388608,33554432 --batches 1,16,64,256 --context 1536 --repeats 10)
  SCRUB=()
fi
step bench-owner-check 120 "$PYTHON" benchmark/owner_check.py "${SIZES[@]}" --skip-serving \
  --plot "$RESULTS_DIR/owner_check_gpu.png" --json "$RESULTS_DIR/owner_check_gpu.json"
step bench-scrub 60 "$PYTHON" benchmark/scrub.py --skip-serving "${SCRUB[@]}"

if have_sglang || [ "$SMOKE" = 1 ]; then
  step server 200 "${PYTEST[@]}" test/e2e/test_owner_check.py -rs
  if [ "$SMOKE" = 1 ]; then
    skip serving "CPU smoke run (benchmark/owner_check.py runs its serving part on CPU by itself)"
  else
    step serving 180 "$PYTHON" benchmark/owner_check.py --pools 65536 --batches 1 --repeats 2 \
      --serving-pool 8388608 --requests 32 --repeat-count 10 --plot "" --json "$RESULTS_DIR/owner_check_serving.json"
  fi
else
  skip server "sglang with its CUDA kernels is not importable (install requirements/cuda.txt or set WHEELS)"
  skip serving "same"
fi

if "$PYTHON" -c 'import mooncake.engine' >/dev/null 2>&1 && { have_sglang || [ "$SMOKE" = 1 ]; }; then
  step pd 240 "$PYTHON" -m pytest -q -p no:cacheprovider -o addopts= test/e2e/test_pd.py -rs
else
  skip pd "mooncake.engine (pip mooncake-transfer-engine) or sglang's CUDA kernels not importable"
fi

log "SUMMARY: pass=$PASS fail=$FAIL skip=$SKIP in $(($(date +%s) - START))s; results in $RESULTS"
[ "$FAIL" -eq 0 ]
