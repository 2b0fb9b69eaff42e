"""A Mamba2 hybrid (Nemotron-H) served on CPU, upstream and through sglang-iso with tenants.

A tiny Nemotron-H (``sglang_iso_testing/tiny_nemotron_h.py``: Mamba2, MLP and full-attention layers, seeded
weights) whose Mamba2 layers run the torch stand-ins of ``platform/mamba2_cpu.py`` at SGLang's own call sites. Its
recurrent state is two tensors per layer (the convolution window and the SSM state) in the same ``MambaPool`` as
Qwen3-Next's GDN layers, under the same hybrid tree, state scrub and owner check. The oracles are
``test_linear_attn_cpu.py``'s, run here on this model: this module imports those tests and that module's
``server``, ``upstream`` and ``keys`` fixtures, and its own ``model`` fixture makes them serve Nemotron-H. Here
only: upstream's greedy tokens equal those of transformers' own Nemotron-H on the same checkpoint, for a prompt and
for its continuation served from the state snapshot (the stand-ins compute the model, and a state hit computes what
recomputation does).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_iso_testing.process import ServerProcess, request_json
from sglang_iso_testing.tiny_nemotron_h import write_tiny_nemotron_h

from .test_linear_attn_cpu import (  # noqa: F401  (fixtures and tests collected here, on this module's model)
    NEW_TOKENS,
    keys,
    server,
    test_a_planted_foreign_state_snapshot_is_redirected_and_the_request_aborted,
    test_a_tenants_continuation_hits_its_state_another_tenant_misses_with_the_same_tokens,
    test_after_pool_pressure_every_free_page_and_state_slot_is_zero,
    test_differential_against_upstream_on_a_random_multi_tenant_trace,
    test_served_with_the_hybrid_tree_state_scrub_and_owner_check,
    upstream,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_nemotron_h(tmp_path_factory.mktemp("tiny-nemotron-h"))


def _reference(model: Path, ids: list[int]) -> list[int]:
    """Greedy tokens of transformers' Nemotron-H (its torch reference path) on the same checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return [int(t) for t in out[0, len(ids) :]]


def test_upstream_equals_transformers_nemotron_h_on_a_prompt_and_its_state_hit(
    upstream: ServerProcess,  # noqa: F811  (the imported fixture)
    model: Path,
) -> None:
    prompt = [1, *(300 + (37 * i) % 1700 for i in range(39))]

    def served(ids: list[int]) -> dict:
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
        }
        status, out = request_json(upstream.base_url + "/generate", body)
        assert status == 200, out
        return out

    first = served(prompt)
    assert first["output_ids"] == _reference(model, prompt)
    follow = [*prompt, *first["output_ids"], 500, 600, 700]
    again = served(follow)
    assert again["meta_info"]["cached_tokens"] >= len(prompt)  # served from the prompt's state snapshot
    assert again["output_ids"] == _reference(model, follow)
