"""The generated EAGLE / EAGLE3 draft heads: the tensors SGLang's head classes load, seeded, and echo heads echo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from sglang_iso.models import tiny_model_path
from sglang_iso_testing.eagle_head import ARCHITECTURES, TOKENIZER_FILES, expected_tensors, write_eagle_head

KINDS = sorted(ARCHITECTURES)


def _load(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def _hf_layer_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of one transformers Llama decoder layer for ``config``: an independent reference."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    layer = LlamaDecoderLayer(LlamaConfig(**config), layer_idx=0)
    return {f"layers.0.{name}": tuple(t.shape) for name, t in layer.state_dict().items()}


def _target_config() -> dict:
    return json.loads((tiny_model_path() / "config.json").read_text())


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_holds_exactly_the_tensors_of_the_config(tmp_path: Path, kind: str) -> None:
    head = write_eagle_head(tmp_path / kind, kind=kind)
    config = json.loads((head / "config.json").read_text())
    tensors = _load(head)
    assert {n: tuple(t.shape) for n, t in tensors.items()} == expected_tensors(config, kind)
    assert config["architectures"] == [ARCHITECTURES[kind]] and config["num_hidden_layers"] == 1
    assert config["tie_word_embeddings"] is False  # SGLang swaps embedding and head in one after the other
    assert all(t.is_floating_point() and torch.isfinite(t).all() for n, t in tensors.items() if n != "d2t")
    assert all((head / name).read_bytes() == (tiny_model_path() / name).read_bytes() for name in TOKENIZER_FILES)
    # neither kind carries the embedding: SGLang binds the target's
    assert not any("embed_tokens" in name for name in tensors)


def test_eagle_layer_is_a_llama_layer_without_input_norm(tmp_path: Path) -> None:
    head = write_eagle_head(tmp_path / "h", kind="EAGLE")
    config = json.loads((head / "config.json").read_text())
    hf = _hf_layer_shapes(_target_config())
    layer = {n: s for n, s in expected_tensors(config, "EAGLE").items() if n.startswith("layers.0.")}
    assert layer == {n: s for n, s in hf.items() if "input_layernorm" not in n}
    hidden = int(config["hidden_size"])
    shapes = {n: tuple(t.shape) for n, t in _load(head).items()}
    assert shapes["fc.weight"] == (hidden, 2 * hidden) and shapes["fc.bias"] == (hidden,)


def test_eagle3_layer_reads_twice_the_hidden_and_maps_a_draft_vocabulary(tmp_path: Path) -> None:
    head = write_eagle_head(tmp_path / "h", kind="EAGLE3")
    config = json.loads((head / "config.json").read_text())
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    hf = _hf_layer_shapes(_target_config())
    layer = {n: s for n, s in expected_tensors(config, "EAGLE3").items() if n.startswith("layers.0.")}
    assert set(layer) == set(hf) | {"layers.0.hidden_norm.weight"}
    for proj in ("q_proj", "k_proj", "v_proj"):
        name = f"layers.0.self_attn.{proj}.weight"
        assert layer[name] == (hf[name][0], 2 * hidden)
    ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    # SGLang captures the input of target layer id + 1: every id must name a layer of the target
    assert all(0 <= i + 1 < int(_target_config()["num_hidden_layers"]) for i in ids) and len(set(ids)) == len(ids)
    tensors = _load(head)
    assert tuple(tensors["fc.weight"].shape) == (hidden, hidden * len(ids))
    draft_vocab = int(config["draft_vocab_size"])
    target_ids = tensors["d2t"] + torch.arange(draft_vocab)
    assert 0 < draft_vocab < vocab and tensors["lm_head.weight"].shape[0] == draft_vocab
    assert target_ids.min() >= 0 and target_ids.max() < vocab and target_ids.unique().numel() == draft_vocab


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_weights_other_seed_other_weights(tmp_path: Path, kind: str) -> None:
    a = _load(write_eagle_head(tmp_path / "a", kind=kind, seed=3))
    b = _load(write_eagle_head(tmp_path / "b", kind=kind, seed=3))
    c = _load(write_eagle_head(tmp_path / "c", kind=kind, seed=4))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["fc.weight"], c["fc.weight"])  # positive control: the seed reaches the weights


def test_unknown_kind_is_refused_naming_the_kinds(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="EAGLE3"):
        write_eagle_head(tmp_path / "h", kind="MEDUSA")


def _embedding() -> torch.Tensor:
    with safe_open(str(tiny_model_path() / "model.safetensors"), framework="pt") as f:
        return f.get_tensor("model.embed_tokens.weight").float()


@pytest.mark.parametrize("echo", [True, False])
def test_eagle_echo_head_proposes_the_token_it_is_fed(tmp_path: Path, echo: bool) -> None:
    # The EAGLE forward with this head: fc([E[x], h]) through a layer that adds nothing, then the target's
    # tied LM head E. A random head (the negative control) proposes the fed token almost never.
    t = _load(write_eagle_head(tmp_path / "h", kind="EAGLE", echo=echo))
    embed = _embedding()
    tokens = torch.arange(1, embed.shape[0])  # 0 is the padding token, whose embedding is zero
    target_hidden = torch.randn(tokens.numel(), embed.shape[1])
    x = torch.cat([embed[tokens], target_hidden], dim=-1) @ t["fc.weight"].T + t["fc.bias"]
    if echo:
        assert not t["layers.0.self_attn.o_proj.weight"].any() and not t["layers.0.mlp.down_proj.weight"].any()
    hit = ((x @ embed.T).argmax(-1) == tokens).float().mean()
    assert hit == 1.0 if echo else hit < 0.05, float(hit)


@pytest.mark.parametrize("echo", [True, False])
def test_eagle3_echo_head_proposes_the_embedded_token(tmp_path: Path, echo: bool) -> None:
    # The EAGLE3 forward with this head: fc over [embedding capture, layer-0 capture], a layer that adds
    # nothing, the final RMS norm, its LM head over draft ids, and d2t back to target ids.
    t = _load(write_eagle_head(tmp_path / "h", kind="EAGLE3", echo=echo))
    embed = _embedding()
    tokens = torch.arange(1, embed.shape[0])
    aux = torch.cat([embed[tokens], torch.randn(tokens.numel(), embed.shape[1])], dim=-1)
    x = aux @ t["fc.weight"].T
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    logits = normed @ t["lm_head.weight"].T
    assert torch.isfinite(logits).all()
    proposed = logits.argmax(-1) + t["d2t"][logits.argmax(-1)]
    hit = (proposed == tokens).float().mean()
    assert hit == 1.0 if echo else hit < 0.05, float(hit)
