"""What sglang-iso refuses at start, as one table: features in, refusals out (pure: no torch, no SGLang import).

A feature sglang-iso does not harden is refused by name before the server serves,
never served unhardened. :class:`Features` says what a server would run with; it is
read twice, from two sources of the same facts:

* the launcher (``server/args.py``) reads it from the command line, before SGLang
  starts (``stage="launch"``);
* the scheduler's cache factory and its ``Scheduler.__init__`` hook read it from
  SGLang's ``ServerArgs`` and the loaded model (``stage="scheduler"``), so a server
  started without the launcher (``--radix-cache-backend tenant`` on plain SGLang) is
  refused as well.

Each :class:`Row` is one refused feature; its ``feature`` is the name the README's
coverage table gives it (``test/unit/test_coverage.py`` binds the two). A row's
check returns the message fragment that names the flag, or None. Rows of a
``group`` are reported together:

* ``"launch"``: argv policy, reported one at a time (the message is a sentence);
* ``"tree"``: ``the tenant tree cache does not support <fragments>``;
* ``"owner-check"``: ``--kv-owner-check on does not cover <fragments>``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from sglang_iso.constants import BACKEND_NAME
from sglang_iso.server.argv import flag_value, has_flag
from sglang_iso.server.speculative import COVERED_ALGORITHMS, has_draft_model, uncovered_speculative

Stage = Literal["launch", "scheduler"]
Group = Literal["launch", "tree", "owner-check"]

PD_COVERED_BACKENDS: dict[str, tuple[str, ...]] = {
    "prefill": ("mooncake", "mooncake_tcp"),
    "decode": ("mooncake", "mooncake_tcp"),
}
"""Disaggregation mode -> the transfer backends whose drain signals the quarantine reads."""
UNCOVERED_PD_FLAGS: dict[str, str] = {
    "--disaggregation-decode-enable-radix-cache": "a decode radix cache keeps transferred pages in a shared tree",
    "--disaggregation-decode-enable-offload-kvcache": "decode KV offload copies transferred pages off the device",
    "--enable-pd-role-switch": "role switching rebuilds transfer state the quarantine tracks",
}
"""PD switches whose KV lives outside the quarantined device pages: flag -> why."""
BYPASS_FLAGS: dict[str, str] = {
    "--grpc-port": "the native gRPC front end skips the HTTP tenant gate",
    "--smg-grpc-mode": "the gRPC front end skips the HTTP tenant gate",
    "--grpc-mode": "the gRPC front end skips the HTTP tenant gate",
    "--api-key": "tenant keys replace the shared API key",
    "--admin-api-key": "admin keys are listed in the tenants file (admin_key_sha256)",
}
"""Flags whose requests skip the tenant gate or the tokenizer manager's tagging (refused with a tenants file)."""
BYPASS_ENV: dict[str, str] = {
    "SGLANG_RUST_SERVER": "the Rust front end skips the tokenizer manager",
    "SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES": "header overrides let clients change scheduling fields",
    "SGLANG_ENABLE_REQUEST_DECOMPRESSION": "bodies decompressed after the tenant gate would reach SGLang unchecked",
    "SGLANG_DISAGG_STAGING_BUFFER": "PD staging buffers hold transferred KV outside the quarantined pages",
}
"""Environment switches refused with a tenants file (set to 1, true or yes): name -> why."""
STORAGE_FLAG = "--hicache-storage-backend"
HYBRID_SSM_FLAGS: dict[str, str] = {
    "--enable-hierarchical-cache": "the host tier keeps no recurrent state",
    "--speculative-algorithm": "draft state pools are not scrubbed or namespaced",
    "--disaggregation-mode": "transferred state is outside the quarantine",
    "--enable-streaming-session": "streaming sessions match outside the namespace check",
    "--enable-session-radix-cache": "session references pin nodes outside the namespace check",
    "--enable-unified-cache-external-linker": "an external cache linker loads KV outside the namespace check",
    "--enable-lora": "adapters are not namespaced in the hybrid tree",
}
"""Flags refused with hybrid SSM models (their tree is SGLang's unified tree under the tenant rules): flag -> why."""
MAMBA_STRATEGY_FLAG = "--mamba-radix-cache-strategy"
MAMBA_STRATEGY = "no_buffer"
"""The recurrent-state cache strategy served: snapshots only where a request's state already is (the launcher adds
it for hybrid SSM models); the extra-buffer strategies' ping-pong track slots are not covered."""
TENANT_LIMIT_FIELDS = ("quota_tokens", "host_quota_tokens", "l3_quota_tokens", "shared_prefixes")
"""Tenants-file settings enforced per namespace by the tenant tree."""
HYBRID_REFUSED_LIMITS = frozenset({"shared_prefixes"})
"""Those the hybrid tree does not enforce (its quotas: ``quota_tokens``, ``integration/hybrid_cache.py``; the host and
L3 quotas cap tiers refused with it)."""


class NotCoveredError(RuntimeError):
    """A feature, model, pool or setting sglang-iso does not harden: the server refuses to start, naming it.

    The one error type of every refusal at start (the coverage table's, and the scheduler's own checks of pools,
    draft models, NGRAM corpora and the host tier)."""


@dataclass(frozen=True)
class Features:
    """What a server would run with, as far as coverage goes. Immutable; build it with a ``from_*`` method."""

    stage: Stage
    """Where it was read: the launcher's command line, or the scheduler's ``ServerArgs``."""
    radix_cache_backend: str | None = None
    """``--radix-cache-backend`` as given (None: not given)."""
    speculative_algorithm: str | None = None
    """``--speculative-algorithm`` as given (None: off)."""
    dllm_algorithm: str | None = None
    """``--dllm-algorithm`` (None: off)."""
    disaggregation_mode: str | None = None
    """``--disaggregation-mode`` (None: not disaggregated; SGLang's ``"null"`` reads as None)."""
    transfer_backend: str = "mooncake"
    """``--disaggregation-transfer-backend`` (SGLang's default when not given)."""
    pd_flags: frozenset[str] = frozenset()
    """The :data:`UNCOVERED_PD_FLAGS` that are on."""
    decode_retraction_backup: str | None = None
    """``--disaggregation-decode-retraction-backup``."""
    decode_host_receive_threshold: str | None = None
    """``--disaggregation-decode-host-receive-threshold`` as text (None: not given)."""
    hierarchical_cache: bool = False
    """``--enable-hierarchical-cache``."""
    storage_backend: str | None = None
    """``--hicache-storage-backend`` (at the scheduler: one that reached SGLang; the launcher takes ``file``)."""
    host_memory_mode: str | None = None
    """``--hicache-host-memory-mode``."""
    kv_owner_check: bool = True
    """``--kv-owner-check on`` (at the scheduler: on and the tree cache enabled)."""
    tenants_file: bool = False
    """A tenants file is configured."""
    bypass_flags: frozenset[str] = frozenset()
    """The :data:`BYPASS_FLAGS` given."""
    tokenizer_workers: str | None = None
    """``--tokenizer-worker-num`` as text (None: not given)."""
    bypass_env: frozenset[str] = frozenset()
    """The :data:`BYPASS_ENV` switches that are on."""
    hybrid_swa: bool = False
    """The model has sliding-window layers beside full attention (known at the scheduler only)."""
    hybrid_ssm: bool = False
    """The model has SSM/Mamba layers (at the launcher: read from a local model directory's config)."""
    dsa: bool = False
    """The model uses DSA sparse attention (at the launcher: read from a local model directory's config)."""
    attention_sinks: bool = False
    """The model's attention takes per-head sink logits (gpt-oss; read from a local model directory's config)."""
    attention_backends: frozenset[str] = frozenset()
    """The attention backends named (``--attention-backend`` and the prefill/decode ones; at the launcher
    ``torch_native`` on CPU when none is given, the launcher's default there)."""
    device: str | None = None
    """The device SGLang runs on (``--device``; at the launcher ``cpu`` when not given and CUDA is absent)."""
    kv_pool_class: str | None = None
    """The class name of the scheduler's KV pool (None: not known at this stage)."""
    unscrubbed_tensors: frozenset[str] = frozenset()
    """Tensors of the KV pool that scrub-on-free does not zero (``Class.attribute``; empty with scrub off)."""
    hybrid_ssm_flags: frozenset[str] = frozenset()
    """The :data:`HYBRID_SSM_FLAGS` that are on."""
    mamba_strategy: str | None = None
    """``--mamba-radix-cache-strategy`` (None: not given; at the scheduler SGLang's resolved value)."""
    tenant_limits: frozenset[str] = frozenset()
    """Tenants-file settings the tenant tree enforces per namespace (``quota_tokens``, ``host_quota_tokens``,
    ``l3_quota_tokens``, ``shared_prefixes``) that are set (known at the scheduler only)."""

    @classmethod
    def from_argv(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        kv_owner_check: bool,
        tenants_file: bool,
        model_config: Mapping[str, Any] | None = None,
        cuda_available: bool = True,
    ) -> Features:
        """The features of an SGLang command line (the launcher's, before it rewrites the storage flag);
        ``model_config`` is the model directory's ``config.json`` when it is local."""
        threshold = flag_value(argv, "--disaggregation-decode-host-receive-threshold")
        return cls(
            stage="launch",
            radix_cache_backend=flag_value(argv, "--radix-cache-backend"),
            speculative_algorithm=flag_value(argv, "--speculative-algorithm"),
            dllm_algorithm=flag_value(argv, "--dllm-algorithm"),
            disaggregation_mode=_mode(flag_value(argv, "--disaggregation-mode")),
            transfer_backend=flag_value(argv, "--disaggregation-transfer-backend") or "mooncake",
            pd_flags=frozenset(f for f in UNCOVERED_PD_FLAGS if has_flag(argv, f)),
            decode_retraction_backup=flag_value(argv, "--disaggregation-decode-retraction-backup"),
            decode_host_receive_threshold=threshold,
            hierarchical_cache=has_flag(argv, "--enable-hierarchical-cache"),
            storage_backend=flag_value(argv, STORAGE_FLAG),
            host_memory_mode=flag_value(argv, "--hicache-host-memory-mode"),
            kv_owner_check=kv_owner_check,
            tenants_file=tenants_file,
            bypass_flags=frozenset(f for f in BYPASS_FLAGS if has_flag(argv, f)),
            tokenizer_workers=flag_value(argv, "--tokenizer-worker-num"),
            bypass_env=frozenset(n for n in BYPASS_ENV if env.get(n, "").lower() in ("1", "true", "yes")),
            dsa=is_dsa_config(model_config or {}),
            hybrid_ssm=is_hybrid_ssm_config(model_config or {}),
            attention_sinks=is_attention_sink_config(model_config or {}),
            attention_backends=_backends(
                [flag_value(argv, f) for f in ATTENTION_BACKEND_FLAGS],
                cpu=(flag_value(argv, "--device") or (None if cuda_available else "cpu")) == "cpu",
            ),
            device=flag_value(argv, "--device") or (None if cuda_available else "cpu"),
            hybrid_ssm_flags=frozenset(f for f in HYBRID_SSM_FLAGS if has_flag(argv, f)),
            mamba_strategy=flag_value(argv, MAMBA_STRATEGY_FLAG),
        )

    @classmethod
    def from_server_args(
        cls,
        server_args: Any,
        *,
        kv_owner_check: bool,
        tenants_file: bool,
        hierarchical_cache: bool | None = None,
        hybrid_swa: bool = False,
        hybrid_ssm: bool = False,
        dsa: bool = False,
        attention_sinks: bool = False,
        kv_pool_class: str | None = None,
        unscrubbed_tensors: frozenset[str] = frozenset(),
        tenant_limits: frozenset[str] = frozenset(),
    ) -> Features:
        """The features of SGLang's ``ServerArgs`` (read by attribute; model and pool facts from the caller)."""
        get = lambda name: getattr(server_args, name, None)  # noqa: E731
        algorithm = get("speculative_algorithm")
        return cls(
            stage="scheduler",
            radix_cache_backend=get("radix_cache_backend"),
            speculative_algorithm=None if algorithm is None else str(getattr(algorithm, "name", algorithm)),
            dllm_algorithm=get("dllm_algorithm") or None,
            disaggregation_mode=_mode(get("disaggregation_mode")),
            transfer_backend=str(get("disaggregation_transfer_backend") or "mooncake"),
            hierarchical_cache=bool(get("enable_hierarchical_cache"))
            if hierarchical_cache is None
            else hierarchical_cache,
            storage_backend=get("hicache_storage_backend") or None,
            host_memory_mode=get("hicache_host_memory_mode"),
            kv_owner_check=kv_owner_check,
            tenants_file=tenants_file,
            hybrid_swa=hybrid_swa,
            hybrid_ssm=hybrid_ssm,
            dsa=dsa,
            attention_sinks=attention_sinks,
            attention_backends=_backends(
                [get(f.removeprefix("--").replace("-", "_")) for f in ATTENTION_BACKEND_FLAGS]
            ),
            device=get("device"),
            kv_pool_class=kv_pool_class,
            unscrubbed_tensors=unscrubbed_tensors,
            hybrid_ssm_flags=frozenset(f for f in HYBRID_SSM_FLAGS if get(_attr(f)) not in (None, False, "", "null")),
            mamba_strategy=get(_attr(MAMBA_STRATEGY_FLAG)),
            tenant_limits=tenant_limits,
        )


class Row(NamedTuple):
    """One refused feature."""

    feature: str
    """Its name in the README's coverage table."""
    stages: tuple[Stage, ...]
    """Where it is checked."""
    group: Group
    """How it is reported (see the module doc)."""
    check: Callable[[Features], str | None]
    """The message (``"launch"``) or fragment naming the flag when ``features`` has it, else None."""


class Refusal(NamedTuple):
    """One refused feature of one server."""

    feature: str
    group: Group
    message: str


def refusals(features: Features, *, group: Group | None = None) -> list[Refusal]:
    """Every row that refuses ``features`` at its stage (of ``group``, if given), in table order."""
    out = []
    for row in ROWS:
        if features.stage not in row.stages or group not in (None, row.group):
            continue
        message = row.check(features)
        if message is not None:
            out.append(Refusal(row.feature, row.group, message))
    return out


def explain(found: Sequence[Refusal]) -> str:
    """One message for a non-empty list of refusals, led by the first in table order.

    A ``"launch"`` refusal speaks for itself; otherwise the tree and owner-check fragments are joined.
    """
    if found[0].group == "launch":
        return found[0].message
    parts = []
    tree = [r.message for r in found if r.group == "tree"]
    if tree:
        parts.append(f"the tenant tree cache does not support {', '.join(tree)}")
    owner = [r.message for r in found if r.group == "owner-check"]
    if owner:
        parts.append(f"--kv-owner-check on does not cover {'; '.join(owner)}; drop it or pass --kv-owner-check off")
    return "; ".join(parts)


class Family(NamedTuple):
    """One model family and the KV pool class SGLang gives it."""

    family: str
    """The models, as the README's model-family table names them."""
    pool: str
    """SGLang's KV pool class (the exact class: a subclass is another row)."""
    status: Literal["served with tenants", "served", "refused"]
    """``served with tenants``: shown end to end on CPU; ``served``: GPU-only parts shown at pool level on CPU."""
    shown_by: str
    """Where it is shown, or why it is refused."""


FAMILIES: tuple[Family, ...] = (
    Family(
        "dense attention (GQA/MHA): Llama, Qwen, Mistral, GLM-4.5/4.6",
        "MHATokenToKVPool",
        "served with tenants",
        "every e2e test (`test/e2e/`)",
    ),
    Family(
        "dense attention, FP4 KV cache", "MHATokenToKVPoolFP4", "served", "`test/integration/test_pool_coverage.py`"
    ),
    Family(
        "dense attention, MXFP8 KV cache", "MHATokenToKVPoolMXFP8", "served", "`test/integration/test_pool_coverage.py`"
    ),
    Family(
        "MLA and MoE, with MTP: DeepSeek-V3/R1, Kimi K2, GLM-4.7-Flash",
        "MLATokenToKVPool",
        "served with tenants",
        "`test/e2e/test_mla.py`",
    ),
    Family("MLA, FP4 KV cache", "MLATokenToKVPoolFP4", "served", "`test/integration/test_pool_coverage.py`"),
    Family(
        "DSA sparse attention: GLM-5, DeepSeek-V3.2",
        "DSATokenToKVPool",
        "served",
        "`test/integration/test_pool_coverage.py` (SGLang's DSA indexer has no CPU path: refused on CPU)",
    ),
    Family(
        "hybrid SWA in one pool (`--disable-hybrid-swa-memory`, the launcher's default): Laguna, gpt-oss; Llama 4 "
        "in the same layout",
        "MHATokenToKVPool",
        "served with tenants",
        "`test/e2e/test_swa.py` and the leak fuzzer (Laguna-shaped, torch_native: the window is an attention mask); "
        "`test/e2e/test_gpt_oss.py` (gpt-oss-shaped with sinks and experts, on the Triton backend: torch_native has "
        "no sinks)",
    ),
    Family(
        "hybrid SWA in SGLang's SWA sub-pool layout (`--iso-swa-layout sub-pool`, Triton backend)",
        "SWAKVPool",
        "served with tenants",
        "`test/e2e/test_swa.py` (Laguna-shaped on Triton, interpreted): SGLang's unified tree with its SWA component "
        "under the namespace check (`integration/hybrid_cache.py`), differential against upstream; owner check of "
        "both sub-pools (`integration/swa_owner.py`: planted full slot and planted sliding-window map entry); scrub "
        "of both sub-pools: `test/integration/test_swa_scrub.py`",
    ),
    Family(
        "hybrid linear attention: Qwen3.5, Qwen3-Next, Nemotron-H",
        "HybridLinearKVPool",
        "served with tenants",
        "`test/e2e/test_linear_attn_cpu.py` on a tiny Qwen3-Next (GDN layers) and a tiny Nemotron-H (Mamba2 "
        "layers), both on the CPU stand-ins, upstream equal to transformers' models; state snapshots on SGLang's "
        "unified tree under the namespace check (`integration/hybrid_cache.py`); per-namespace quotas; scrub of "
        "freed state slots: `test/integration/test_mamba_scrub.py`",
    ),
    Family("anything else", "any other class", "refused", "an unknown pool fails closed"),
)
"""Model families by KV pool class, in the order the README's model-family table lists them."""

SWA_LAYOUT_FLAG = "--disable-hybrid-swa-memory"
"""SGLang's flag that keeps a hybrid SWA model's KV in one pool for every layer (the launcher adds it)."""

COVERED_POOLS: frozenset[str] = frozenset(f.pool for f in FAMILIES if f.status != "refused")
"""The KV pool classes the tenant cache serves with (exact class names)."""

DSA_ARCHITECTURES: frozenset[str] = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "Glm5NextForConditionalGenerationNextN",
        "Glm5NextForConditionalGeneration",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "Dots3NoteForCausalLM",
        "Dots3NoteForCausalLMNextN",
        "HYV4ForCausalLM",
        "HYV4ForCausalLMNextN",
    }
)
"""Architectures SGLang runs with DSA sparse attention when their config has ``index_topk``
(``is_deepseek_dsa`` in the pinned wheel; ``test/integration/test_compat.py`` compares the two)."""


def is_dsa_config(config: Mapping[str, Any]) -> bool:
    """True when a model's ``config.json`` (as a dict) describes a DSA model, as SGLang decides it."""
    architectures = config.get("architectures")
    first = architectures[0] if isinstance(architectures, list) and architectures else None
    return first in DSA_ARCHITECTURES and config.get("index_topk") is not None


HYBRID_SSM_MODEL_TYPES: frozenset[str] = frozenset(
    {
        "bailing_hybrid", "falcon_h1", "falcon_mamba", "glm5_next", "granitemoehybrid", "inkling_mm_model",
        "inkling_model", "intern_s2_preview", "jet_nemotron", "jet_vlm", "kimi_linear", "lfm2", "lfm2_moe", "lfm2_vl",
        "mamba", "mamba2", "minicpm_sala", "nemotron_h", "NemotronH_Nano_VL_V2", "qwen3_5", "qwen3_5_moe",
        "qwen3_next", "zaya",
    }
)  # fmt: skip
"""``model_type`` of every config class SGLang runs with recurrent state (``configs/hybrid_arch.py`` in the pinned
wheel; ``test/integration/test_compat.py`` compares the two)."""


ATTENTION_SINK_ARCHITECTURES: frozenset[str] = frozenset({"GptOssForCausalLM"})
"""Architectures whose attention passes per-head sink logits (``sinks=``), which the torch_native backend does not
take (``test/integration/test_compat.py`` checks its signature)."""
ATTENTION_BACKEND_FLAGS = ("--attention-backend", "--prefill-attention-backend", "--decode-attention-backend")
CPU_ATTENTION_BACKEND = "torch_native"
"""The attention backend sglang-iso's launcher picks on CPU when none is given."""


def is_attention_sink_config(config: Mapping[str, Any]) -> bool:
    """True when a model's ``config.json`` (as a dict), or its text or language model's, names an architecture with
    attention sinks."""
    for section in (config, config.get("text_config"), config.get("llm_config")):
        architectures = section.get("architectures") if isinstance(section, Mapping) else None
        if isinstance(architectures, list) and ATTENTION_SINK_ARCHITECTURES & set(architectures):
            return True
    return False


def _backends(named: Sequence[Any], *, cpu: bool = False) -> frozenset[str]:
    given = frozenset(str(b) for b in named if b)
    return given or (frozenset({CPU_ATTENTION_BACKEND}) if cpu else frozenset())


def is_hybrid_ssm_config(config: Mapping[str, Any]) -> bool:
    """True when a model's ``config.json`` (as a dict) describes a model with recurrent state, by its
    ``model_type`` or its text or language model's. A Granite hybrid counts when it has a Mamba layer, as SGLang
    decides it; the other conditional ones (a MiniCPM hybrid, Inkling) count always (fail closed)."""
    types = {config.get("model_type")}
    for inner in ("text_config", "llm_config"):
        nested = config.get(inner)
        if isinstance(nested, Mapping):
            types.add(nested.get("model_type"))
    if "granitemoehybrid" in types:
        layer_types = config.get("layer_types")
        return isinstance(layer_types, list) and "mamba" in layer_types
    return bool(types & HYBRID_SSM_MODEL_TYPES)


def families_markdown() -> str:
    """The README's model-family table (``test/unit/test_coverage.py`` compares the two)."""
    lines = ["| model family | SGLang KV pool | status | shown by / why |", "|---|---|---|---|"]
    for f in FAMILIES:
        pool = f.pool if f.pool == "any other class" else f"`{f.pool}`"
        lines.append(f"| {f.family} | {pool} | {f.status} | {f.shown_by} |")
    return "\n".join(lines)


def table_markdown() -> str:
    """The README's coverage table, one line per row (``test/unit/test_coverage.py`` compares the two)."""
    lines = ["| refused at start | checked by |", "|---|---|"]
    where = {("launch",): "launcher", ("scheduler",): "scheduler", ("launch", "scheduler"): "launcher and scheduler"}
    for row in ROWS:
        lines.append(f"| {row.feature} | {where[row.stages]} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------- the rows


def _mode(value: object) -> str | None:
    return None if value in (None, "", "null") else str(value)


def _radix_backend(f: Features) -> str | None:
    backend = f.radix_cache_backend
    if backend is None or backend == BACKEND_NAME:
        return None
    return (
        f"--radix-cache-backend {backend!r} is not allowed: sglang-iso serves only with {BACKEND_NAME!r}. "
        "Use `python -m sglang.launch_server` for an unhardened server."
    )


def _pd_mode(f: Features) -> str | None:
    if f.disaggregation_mode is None or f.disaggregation_mode in PD_COVERED_BACKENDS:
        return None
    return f"--disaggregation-mode {f.disaggregation_mode} is not supported by sglang-iso (covered: prefill, decode)"


def _pd_backend(f: Features) -> str | None:
    covered = PD_COVERED_BACKENDS.get(f.disaggregation_mode or "")
    if covered is None or f.transfer_backend in covered:
        return None
    return (
        f"--disaggregation-transfer-backend {f.transfer_backend} is not supported by sglang-iso with "
        f"--disaggregation-mode {f.disaggregation_mode}: its drain signals are not covered by the transfer "
        f"quarantine (covered: {', '.join(covered)})"
    )


def _pd_flag(flag: str) -> Callable[[Features], str | None]:
    def check(f: Features) -> str | None:
        if f.disaggregation_mode not in PD_COVERED_BACKENDS or flag not in f.pd_flags:
            return None
        return f"{flag} is not supported by sglang-iso: {UNCOVERED_PD_FLAGS[flag]}"

    return check


def _pd_draft(f: Features) -> str | None:
    if f.disaggregation_mode not in PD_COVERED_BACKENDS or not has_draft_model(f.speculative_algorithm):
        return None
    return (
        f"--speculative-algorithm {f.speculative_algorithm} is not supported by sglang-iso with "
        f"--disaggregation-mode {f.disaggregation_mode}: the draft model's KV and hidden states cross workers "
        "outside the transfer quarantine"
    )


def _pd_host_pool(f: Features) -> str | None:
    if f.disaggregation_mode not in PD_COVERED_BACKENDS or f.decode_retraction_backup != "host_pool":
        return None
    return (
        "--disaggregation-decode-retraction-backup host_pool is not supported by sglang-iso: it needs SGLang's "
        "own tree cache (use cpu_tensor, the sglang-iso default, or none)"
    )


def _pd_host_receive(f: Features) -> str | None:
    threshold = f.decode_host_receive_threshold
    if f.disaggregation_mode not in PD_COVERED_BACKENDS or threshold is None or threshold in ("1", "1.0"):
        return None
    return (
        "--disaggregation-decode-host-receive-threshold is not supported by sglang-iso: "
        "host-staged transfers land outside the quarantined device pages"
    )


def _storage_without_hicache(f: Features) -> str | None:
    if f.storage_backend is None or f.hierarchical_cache:
        return None
    return f"{STORAGE_FLAG} needs --enable-hierarchical-cache"


def _storage_backend(f: Features) -> str | None:
    if f.storage_backend is None or not f.hierarchical_cache or f.storage_backend == "file":
        return None
    return (
        f"{STORAGE_FLAG} {f.storage_backend!r} is not supported by sglang-iso: only 'file' (a namespaced, "
        "secret-keyed page store); Mooncake, 3FS, NIXL and the others key pages by client fields"
    )


def _storage_without_tenants(f: Features) -> str | None:
    if f.storage_backend != "file" or not f.hierarchical_cache or f.tenants_file:
        return None
    return f"{STORAGE_FLAG} file needs --tenants-file: its namespace secret keys the store"


def _pd_without_tenants(f: Features) -> str | None:
    if f.disaggregation_mode is None or f.tenants_file:
        return None
    return "--disaggregation-mode needs --tenants-file: its namespace secret keys the transfer tag"


def _bypass(
    name: str, present: Callable[[Features], Collection[str]], message: str
) -> Callable[[Features], str | None]:
    """A check refusing ``message`` when ``name`` is among ``present(features)`` on a server with a tenants file."""

    def check(f: Features) -> str | None:
        return message if f.tenants_file and name in present(f) else None

    return check


def _bypass_flag(flag: str) -> Callable[[Features], str | None]:
    message = f"{flag} cannot be used with --tenants-file: {BYPASS_FLAGS[flag]}"
    return _bypass(flag, lambda f: f.bypass_flags, message)


def _tokenizer_workers(f: Features) -> str | None:
    if not f.tenants_file or f.tokenizer_workers in (None, "1"):
        return None
    return "--tokenizer-worker-num must be 1 with --tenants-file: other workers skip the tenant gate"


def _bypass_env(name: str) -> Callable[[Features], str | None]:
    message = f"environment variable {name} cannot be set with --tenants-file: {BYPASS_ENV[name]}"
    return _bypass(name, lambda f: f.bypass_env, message)


def _hybrid_swa_backend(f: Features) -> str | None:
    if not f.hybrid_swa or CPU_ATTENTION_BACKEND not in f.attention_backends:
        return None
    return (
        f"hybrid SWA models in SGLang's SWA sub-pool layout on the {CPU_ATTENTION_BACKEND} attention backend "
        f"(its sliding layers read untranslated ids; pass --attention-backend triton, or {SWA_LAYOUT_FLAG})"
    )


def _attr(flag: str) -> str:
    """The ``ServerArgs`` attribute of an SGLang flag."""
    return flag.removeprefix("--").replace("-", "_")


def _hybrid_ssm_flag(flag: str) -> Callable[[Features], str | None]:
    def check(f: Features) -> str | None:
        if not (f.hybrid_ssm or f.hybrid_swa) or flag not in f.hybrid_ssm_flags:
            return None
        return f"{flag} with hybrid SSM/Mamba models or the SWA sub-pool layout ({HYBRID_SSM_FLAGS[flag]})"

    return check


def _hybrid_ssm_strategy(f: Features) -> str | None:
    if not f.hybrid_ssm or f.mamba_strategy in (None, "auto", MAMBA_STRATEGY):
        return None
    return f"{MAMBA_STRATEGY_FLAG} {f.mamba_strategy} with hybrid SSM/Mamba models (pass {MAMBA_STRATEGY})"


def _hybrid_ssm_limits(f: Features) -> str | None:
    refused = f.tenant_limits & HYBRID_REFUSED_LIMITS
    if not (f.hybrid_ssm or f.hybrid_swa) or not refused:
        return None
    limits = ", ".join(sorted(refused))
    return f"tenants-file {limits} with hybrid SSM/Mamba models or the SWA sub-pool layout (not enforced per namespace)"


def _sinks_on_torch_native(f: Features) -> str | None:
    if not f.attention_sinks or CPU_ATTENTION_BACKEND not in f.attention_backends:
        return None
    return (
        "models with attention sinks (gpt-oss) on the torch_native attention backend (it takes no sinks): pass "
        "--attention-backend triton (on CPU with TRITON_INTERPRET=1)"
    )


def _dsa_on_cpu(f: Features) -> str | None:
    if not f.dsa or f.device != "cpu":
        return None
    return "DSA sparse attention models on --device cpu (SGLang's DSA indexer has no CPU path)"


def _dsa_with_hicache(f: Features) -> str | None:
    if not f.dsa or not f.hierarchical_cache:
        return None
    return "DSA sparse attention models with --enable-hierarchical-cache (the host tier does not carry index keys)"


def _dsa_with_pd(f: Features) -> str | None:
    if not f.dsa or f.disaggregation_mode is None:
        return None
    return (
        "DSA sparse attention models with --disaggregation-mode "
        "(transferred index keys and compress tails are outside the quarantine)"
    )


def _pool_class(f: Features) -> str | None:
    if f.kv_pool_class is None or f.kv_pool_class in COVERED_POOLS:
        return None
    family = next((x for x in FAMILIES if x.pool == f.kv_pool_class), None)
    if family is None:
        return f"the KV pool class {f.kv_pool_class} (not in the model-family table)"
    return f"the KV pool class {f.kv_pool_class} (refused in the model-family table: {family.family})"


def _unscrubbed(f: Features) -> str | None:
    if not f.unscrubbed_tensors:
        return None
    return f"KV pool tensors scrub-on-free does not zero ({', '.join(sorted(f.unscrubbed_tensors))})"


def _speculative(f: Features) -> str | None:
    return uncovered_speculative(f.speculative_algorithm)


def _draft_with_hicache(f: Features) -> str | None:
    if not f.hierarchical_cache or not has_draft_model(f.speculative_algorithm):
        return None
    return (
        f"--speculative-algorithm {f.speculative_algorithm} with --enable-hierarchical-cache "
        "(no draft KV in the host tier)"
    )


def _storage_reaching_sglang(f: Features) -> str | None:
    if not f.hierarchical_cache or f.storage_backend is None:
        return None
    return (
        f"{STORAGE_FLAG} {f.storage_backend} reaching SGLang (its storage backends key pages by client fields; "
        "sglang-iso's launcher serves 'file' with its own namespaced, secret-keyed store)"
    )


def _host_buffer_only(f: Features) -> str | None:
    if not f.hierarchical_cache or f.host_memory_mode != "buffer_only":
        return None
    return "--hicache-host-memory-mode buffer_only"


def _owner_speculative(f: Features) -> str | None:
    return uncovered_speculative(f.speculative_algorithm) if f.kv_owner_check else None


def _owner_dllm(f: Features) -> str | None:
    if not f.kv_owner_check or not f.dllm_algorithm:
        return None
    return f"--dllm-algorithm {f.dllm_algorithm} (plans attention outside the checked forward)"


def _owner_decode(f: Features) -> str | None:
    if not f.kv_owner_check or f.disaggregation_mode != "decode":
        return None
    return "--disaggregation-mode decode (transferred KV pages have no owner)"


_L: tuple[Stage, ...] = ("launch",)
_S: tuple[Stage, ...] = ("scheduler",)
_LS: tuple[Stage, ...] = ("launch", "scheduler")
_ALGORITHMS = ", ".join(COVERED_ALGORITHMS)

_OWNER_SPEC = f"`--kv-owner-check on` with `--speculative-algorithm` other than {_ALGORITHMS}"

ROWS: tuple[Row, ...] = (
    Row("`--radix-cache-backend` other than `tenant`", _L, "launch", _radix_backend),
    Row("`--disaggregation-mode` other than `prefill` and `decode`", _L, "launch", _pd_mode),
    Row("`--disaggregation-transfer-backend` other than `mooncake`, `mooncake_tcp`", _L, "launch", _pd_backend),
    *(Row(f"`{flag}`", _L, "launch", _pd_flag(flag)) for flag in UNCOVERED_PD_FLAGS),
    Row("a speculative draft model with `--disaggregation-mode`", _L, "launch", _pd_draft),
    Row("`--disaggregation-decode-retraction-backup host_pool`", _L, "launch", _pd_host_pool),
    Row("`--disaggregation-decode-host-receive-threshold` below 1", _L, "launch", _pd_host_receive),
    Row("`--hicache-storage-backend` without `--enable-hierarchical-cache`", _L, "launch", _storage_without_hicache),
    Row("`--hicache-storage-backend` other than `file`", _L, "launch", _storage_backend),
    Row("`--hicache-storage-backend file` without a tenants file", _L, "launch", _storage_without_tenants),
    Row(_OWNER_SPEC, _LS, "owner-check", _owner_speculative),
    Row("`--kv-owner-check on` with `--dllm-algorithm`", _LS, "owner-check", _owner_dllm),
    Row("`--kv-owner-check on` with `--disaggregation-mode decode`", _LS, "owner-check", _owner_decode),
    Row("`--disaggregation-mode` without a tenants file", _LS, "launch", _pd_without_tenants),
    *(Row(f"`{flag}` with a tenants file", _L, "launch", _bypass_flag(flag)) for flag in BYPASS_FLAGS),
    Row("`--tokenizer-worker-num` above 1 with a tenants file", _L, "launch", _tokenizer_workers),
    *(Row(f"`{name}=1` with a tenants file", _L, "launch", _bypass_env(name)) for name in BYPASS_ENV),
    Row(
        "hybrid SWA models in SGLang's SWA sub-pool layout on the torch_native attention backend",
        _S,
        "tree",
        _hybrid_swa_backend,
    ),
    *(
        Row(f"hybrid SSM/Mamba models or the SWA sub-pool layout with `{flag}`", _LS, "tree", _hybrid_ssm_flag(flag))
        for flag in HYBRID_SSM_FLAGS
    ),
    Row(
        f"hybrid SSM/Mamba models with `{MAMBA_STRATEGY_FLAG}` other than `{MAMBA_STRATEGY}`",
        _LS,
        "tree",
        _hybrid_ssm_strategy,
    ),
    Row(
        "hybrid SSM/Mamba models or the SWA sub-pool layout with shared prefixes in the tenants file",
        _S,
        "tree",
        _hybrid_ssm_limits,
    ),
    Row(
        "models with attention sinks (gpt-oss) on the torch_native attention backend",
        _LS,
        "launch",
        _sinks_on_torch_native,
    ),
    Row("DSA sparse attention models (GLM-5, DeepSeek-V3.2, ...) on `--device cpu`", _LS, "tree", _dsa_on_cpu),
    Row("DSA sparse attention models with `--enable-hierarchical-cache`", _LS, "tree", _dsa_with_hicache),
    Row("DSA sparse attention models with `--disaggregation-mode`", _LS, "tree", _dsa_with_pd),
    Row("a KV pool class outside the model-family table", _S, "tree", _pool_class),
    Row("a KV pool tensor that scrub-on-free does not zero", _S, "tree", _unscrubbed),
    Row(f"`--speculative-algorithm` other than {_ALGORITHMS}", _S, "tree", _speculative),
    Row("a speculative draft model with `--enable-hierarchical-cache`", _S, "tree", _draft_with_hicache),
    Row("an SGLang L3 storage backend reaching the scheduler", _S, "tree", _storage_reaching_sglang),
    Row("`--hicache-host-memory-mode buffer_only`", _S, "tree", _host_buffer_only),
)
"""Every feature refused at start, in the order the README's table lists them."""
