"""Every SGLang symbol sglang-iso hooks still exists with the parameters we rely on."""

from __future__ import annotations

import ast
import inspect
import pkgutil
import re
from importlib.metadata import version
from pathlib import Path

import pytest
from sglang.srt.plugins.hook_registry import HookType

import sglang_iso
from sglang_iso import coverage
from sglang_iso.integration import hook_table
from sglang_iso.integration.symbols import HOOKED_SYMBOLS, PINNED_SGLANG_VERSION


def test_installed_sglang_is_the_pinned_release() -> None:
    assert version("sglang") == PINNED_SGLANG_VERSION


@pytest.mark.parametrize("symbol", HOOKED_SYMBOLS, ids=[s.path for s in HOOKED_SYMBOLS])
def test_hooked_symbol_signature(symbol) -> None:  # type: ignore[no-untyped-def]
    obj = pkgutil.resolve_name(symbol.path)
    if not symbol.params:
        return  # a module, constant or class we only name
    if inspect.isclass(obj) and "__dataclass_fields__" in vars(obj):
        names = set(obj.__dataclass_fields__)
    else:
        names = set(inspect.signature(obj).parameters)
    missing = [p for p in symbol.params if p not in names]
    assert not missing, f"{symbol.path} lost parameters {missing}; has {sorted(names)}"


@pytest.mark.parametrize("row", hook_table.HOOKS, ids=[f"{h.target}:{h.kind.name}" for h in hook_table.HOOKS])
def test_hook_table_row_resolves_and_binds(row: hook_table.Hook) -> None:
    module, _, attr = row.target.rpartition(".")
    target = getattr(pkgutil.resolve_name(module), attr)
    assert callable(target), row.target
    hook = hook_table.resolve_hook(row)
    # HookRegistry calls BEFORE hooks with the target's arguments, AFTER hooks with (result, *args),
    # AROUND hooks with (original, *args): the hook must accept the target's required positional parameters.
    params = inspect.signature(target).parameters.values()
    required = [
        p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    lead = [] if row.kind is HookType.BEFORE else ["result_or_original"]
    inspect.signature(hook).bind(*lead, *required)


def test_every_hooked_target_is_listed_in_symbols_with_its_hook_kinds() -> None:
    by_path = {s.path.replace(":", "."): s for s in HOOKED_SYMBOLS}
    wrong = []
    for target in hook_table.targets():
        symbol = by_path.get(target)
        kinds = {h.kind.name for h in hook_table.HOOKS if h.target == target}
        said = set(re.findall(r"\b(BEFORE|AFTER|AROUND|REPLACE)\b", symbol.use)) if symbol else None
        if said != kinds:
            wrong.append(f"{target}: symbols.py says {said}, the hook table registers {sorted(kinds)}")
    assert not wrong, "\n".join(wrong)


def test_every_imported_sglang_name_is_listed_in_symbols() -> None:
    listed = {s.path for s in HOOKED_SYMBOLS}
    unlisted = []
    for path in sorted(Path(sglang_iso.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith("sglang."):
                continue
            for alias in node.names:
                name = f"{node.module}:{alias.name}"
                if name not in listed and not any(p.startswith(f"{name}.") for p in listed):
                    unlisted.append(f"{name} ({path.name})")
    assert not unlisted, f"imported from SGLang but not listed in symbols.py: {unlisted}"


def test_required_groups_cover_the_startup_checks() -> None:
    scheduler = hook_table.targets(required=hook_table.Required.SCHEDULER)
    assert "sglang.srt.model_executor.model_runner.ModelRunner.forward" in scheduler
    assert hook_table.targets(group="spec-draft")[0] in scheduler
    assert len(hook_table.targets(required=hook_table.Required.PD)) == 10
    assert {h.group for h in hook_table.HOOKS} == set(hook_table.GROUPS)


def test_sgl_kernel_names_cover_what_sglang_imports_on_cpu() -> None:
    # Importing the modules that take names from sgl_kernel at import time on
    # CPU fails with ImportError if the stub lacks one.
    import sglang.kernels.ops.speculative.cache_locs
    import sglang.srt.managers.scheduler
    import sglang.srt.mem_cache.allocation
    import sglang.srt.model_executor.model_runner  # noqa: F401


def test_standalone_worker_inherits_the_checked_entry_and_sets_the_step_width() -> None:
    # spec_draft hooks EAGLEWorkerV2.forward_batch_generation: STANDALONE must not override it, and the
    # step width reads attributes its __init__ sets.
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

    assert issubclass(StandaloneWorkerV2, EAGLEWorkerV2)
    assert "forward_batch_generation" not in vars(StandaloneWorkerV2)
    source = inspect.getsource(StandaloneWorkerV2.__init__)
    for attr in ("speculative_num_steps", "topk", "speculative_num_draft_tokens", "adaptive_controller"):
        assert f"self.{attr} =" in source or f"self.{attr}:" in source, attr


def test_test_plugin_targets_resolve_and_bind() -> None:
    # The forged-tag plugin (the monitoring e2e's planted violation) hooks the scheduler's request intake: if SGLang
    # renames it, the e2e would fail on a missing alert rather than say why.
    from sglang_iso_testing import forge_tag

    module, _, attr = forge_tag.TARGET.rpartition(".")
    owner, _, method = module.rpartition(".")
    target = getattr(getattr(pkgutil.resolve_name(owner), method), attr)
    assert "recv_req" in inspect.signature(target).parameters
    inspect.signature(forge_tag.forge_before).bind("scheduler", "recv_req")


def test_dsa_architectures_are_those_sglang_runs_with_dsa() -> None:
    from sglang.srt.configs import model_config

    source = inspect.getsource(model_config.is_deepseek_dsa)
    named = {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    wheel = {name for name in named if name.endswith(("ForCausalLM", "ForCausalLMNextN", "ForConditionalGeneration",
                                                       "ForConditionalGenerationNextN"))}  # fmt: skip
    assert wheel == set(coverage.DSA_ARCHITECTURES)
    for arch in sorted(wheel):
        config = {"architectures": [arch], "index_topk": 2048}
        assert model_config.is_deepseek_dsa(config) and coverage.is_dsa_config(config), arch
        del config["index_topk"]
        assert not model_config.is_deepseek_dsa(config) and not coverage.is_dsa_config(config), arch


def test_hybrid_ssm_model_types_are_those_sglang_runs_with_recurrent_state() -> None:
    """The launcher refuses these from ``config.json`` before SGLang starts (on CPU SGLang's own argument checks
    stop such a model first, without naming the family); the set must follow the pinned wheel's detection."""
    import sglang.srt.configs as configs
    from sglang.srt.configs import hybrid_arch

    tree = ast.parse(inspect.getsource(hybrid_arch))
    classes = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id.endswith("Config")} - {"ModelConfig"}
    by_type = {getattr(configs, name).model_type for name in classes}
    literal = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value == "glm5_next"}
    assert by_type | literal == set(coverage.HYBRID_SSM_MODEL_TYPES)


def test_attention_sink_architectures_pass_sinks_that_torch_native_does_not_take() -> None:
    """The coverage row for attention sinks on torch_native holds while gpt-oss passes ``sinks=`` to its attention
    and torch_native's forward takes no such argument (when it does, the row can go)."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.models import gpt_oss

    assert {m.removesuffix("ForCausalLM") for m in coverage.ATTENTION_SINK_ARCHITECTURES} == {"GptOss"}
    assert "sinks=self.sinks" in inspect.getsource(gpt_oss.GptOssAttention)
    for method in (TorchNativeAttnBackend.forward_extend, TorchNativeAttnBackend.forward_decode):
        parameters = inspect.signature(method).parameters
        assert "sinks" not in parameters and not any(p.kind is p.VAR_KEYWORD for p in parameters.values())
