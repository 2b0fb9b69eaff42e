"""A tiny seeded EAGLE / EAGLE3 draft head for the bundled model, written by hand (no training, no download).

SGLang loads it with ``--speculative-algorithm EAGLE`` (``NEXTN`` is an alias SGLang resolves to EAGLE) or
``EAGLE3`` and ``--speculative-draft-model-path <dir>``; on CPU with ``--attention-backend triton`` under
``TRITON_INTERPRET=1`` (the torch_native backend has no EAGLE draft path). A random head's drafts are almost
always wrong (accept lengths near 1); an ``echo`` head's are right on the bundled model, whose greedy output
repeats a token. Verification keeps greedy output lossless whatever the draft proposes.

* ``EAGLE`` (``LlamaForCausalLMEagle``): ``fc`` maps ``[embedding, target hidden]`` (2 x hidden) to hidden, then
  one Llama decoder layer without its input norm, no final norm. SGLang binds the target's embedding and LM head
  into the draft (``set_embed_and_head``), so the checkpoint holds neither.
* ``EAGLE3`` (``LlamaForCausalLMEagle3``): ``fc`` maps the target's aux hidden states (``AUX_LAYER_IDS``) to
  hidden; one decoder layer whose attention reads ``[normed embedding, normed hidden]`` (2 x hidden), a final
  norm and its own LM head over a draft vocabulary, mapped to target ids by ``d2t`` (draft id + ``d2t[id]`` =
  target id). The embedding comes from the target (``set_embed``).

Tensor names are the checkpoint's (SGLang prefixes ``model.`` when loading); :func:`expected_tensors` lists them
with their shapes for a config.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sglang_iso.models import tiny_model_path

ARCHITECTURES = {"EAGLE": "LlamaForCausalLMEagle", "EAGLE3": "LlamaForCausalLMEagle3"}
INIT_STD = 0.02  # the bundled model's initializer range: activations stay far from overflow
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# NOTE: SGLang captures the input of target layer ``id + 1``, so on the 2-layer bundled model only -1 (the
# embeddings) and 0 (the output of layer 0) are capturable; an id past the last layer is silently never captured.
AUX_LAYER_IDS = (-1, 0)
DRAFT_VOCAB = 1024  # EAGLE3 draft vocabulary of a random head: half of the bundled model's
# NOTE: an echo head scales its logits so the echoed token's is about this much; with the raw embedding (a logit
# of ~0.05 on the bundled model) the softmax is flat and a top-k tree prefers wide over deep.
ECHO_LOGIT = 10.0


def write_eagle_head(
    dest: Path, *, kind: str = "EAGLE", seed: int = 0, echo: bool = False, target: Path | None = None
) -> Path:
    """Write a draft head for ``target`` (default: the bundled tiny model) into ``dest``; returns ``dest``.

    ``dest`` gets ``config.json``, ``model.safetensors`` and the target's tokenizer files. The same arguments
    always give the same weights.

    ``echo`` makes the head propose the token it was fed (EAGLE) or the one before it (EAGLE3, whose ``fc``
    reads the target's embedding capture): ``fc`` passes the embedding through and the decoder layer adds
    nothing (zero ``o_proj`` and ``down_proj``), so the logits peak sharply at that token. The bundled model's
    greedy output mostly repeats one token, so an echo head's drafts are mostly accepted: a positive control
    for accept lengths, and verify passes that accept several tokens at once. An echo EAGLE3 head's draft
    vocabulary is the whole target vocabulary (shuffled), so every token can be echoed.

    Raises:
        ValueError: ``kind`` is not one of ``ARCHITECTURES``.
    """
    if kind not in ARCHITECTURES:
        raise ValueError(f"kind must be one of {sorted(ARCHITECTURES)}, got {kind!r}")
    source = tiny_model_path() if target is None else target
    config = head_config(json.loads((source / "config.json").read_text()), kind, echo=echo)
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in expected_tensors(config, kind).items():
        tensors[name] = _init(name, shape, config, gen)
    if echo:
        with safe_open(str(source / "model.safetensors"), framework="pt") as f:
            embed = f.get_tensor("model.embed_tokens.weight").float()
        tensors.update(_echo_tensors(tensors, embed, kind))
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copyfile(source / name, dest / name)
    return dest


def head_config(target_config: dict, kind: str, *, echo: bool = False) -> dict:
    """The draft head's ``config.json``: the target's Llama config with one layer and the head's architecture."""
    config = {k: v for k, v in target_config.items() if k not in ("architectures", "transformers_version")}
    # NOTE: untied because SGLang replaces the draft's embedding and LM head by the target's one after the
    # other (``set_embed_and_head``), which fails when the two are the same module.
    config.update(architectures=[ARCHITECTURES[kind]], num_hidden_layers=1, tie_word_embeddings=False)
    if kind == "EAGLE3":
        config.update(
            draft_vocab_size=int(target_config["vocab_size"])
            if echo
            else min(DRAFT_VOCAB, int(target_config["vocab_size"])),
            target_hidden_size=int(target_config["hidden_size"]),
            eagle_config={"eagle_aux_hidden_state_layer_ids": list(AUX_LAYER_IDS), "use_aux_hidden_state": True},
        )
    return config


def expected_tensors(config: dict, kind: str) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> shape for a head ``config`` of ``kind`` (what SGLang's model class loads)."""
    hidden = int(config["hidden_size"])
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(config["intermediate_size"])
    attn_in = 2 * hidden if kind == "EAGLE3" else hidden
    layer = "layers.0"
    shapes: dict[str, tuple[int, ...]] = {
        f"{layer}.self_attn.q_proj.weight": (heads * head_dim, attn_in),
        f"{layer}.self_attn.k_proj.weight": (kv_heads * head_dim, attn_in),
        f"{layer}.self_attn.v_proj.weight": (kv_heads * head_dim, attn_in),
        f"{layer}.self_attn.o_proj.weight": (hidden, heads * head_dim),
        f"{layer}.post_attention_layernorm.weight": (hidden,),
        f"{layer}.mlp.gate_proj.weight": (inter, hidden),
        f"{layer}.mlp.up_proj.weight": (inter, hidden),
        f"{layer}.mlp.down_proj.weight": (hidden, inter),
    }
    if kind == "EAGLE":
        # NOTE: layer 0 of an EAGLE head has no input_layernorm (SGLang deletes it) and the model no final norm.
        shapes.update({"fc.weight": (hidden, 2 * hidden), "fc.bias": (hidden,)})
        return shapes
    n_aux = len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    draft_vocab = int(config["draft_vocab_size"])
    shapes.update(
        {
            "fc.weight": (hidden, int(config["target_hidden_size"]) * n_aux),
            f"{layer}.input_layernorm.weight": (hidden,),
            f"{layer}.hidden_norm.weight": (hidden,),
            "norm.weight": (hidden,),
            "lm_head.weight": (draft_vocab, hidden),
            "d2t": (draft_vocab,),
        }
    )
    return shapes


def _echo_tensors(tensors: dict[str, torch.Tensor], embed: torch.Tensor, kind: str) -> dict[str, torch.Tensor]:
    hidden = embed.shape[1]
    fc = torch.zeros_like(tensors["fc.weight"])
    out = {
        name: torch.zeros_like(tensors[name])
        for name in ("layers.0.self_attn.o_proj.weight", "layers.0.mlp.down_proj.weight")
    }
    if kind == "EAGLE":
        # draft logits = E @ (gain * E[token]): the target's LM head is its embedding (tied)
        gain = ECHO_LOGIT / float(embed.pow(2).sum(-1).mean())
        fc[:, :hidden] = gain * torch.eye(hidden)
        return {**out, "fc.weight": fc}
    # EAGLE3: the first aux block is the embedding capture; the final norm scales the hidden state to an RMS of
    # 1, and the draft LM head's rows are the unit embeddings of its vocabulary (draft id + d2t = target id)
    fc[:, :hidden] = torch.eye(hidden)
    ids = torch.arange(tensors["d2t"].shape[0]) + tensors["d2t"]
    rows = embed[ids]
    # NOTE: clamped because the padding token's embedding row is all zeros
    lm_head = rows / rows.norm(dim=-1, keepdim=True).clamp_min(1e-6) * (ECHO_LOGIT / hidden**0.5)
    return {**out, "fc.weight": fc, "lm_head.weight": lm_head}


def _init(name: str, shape: tuple[int, ...], config: dict, gen: torch.Generator) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    if name == "d2t":
        # a seeded subset of the target vocabulary in a seeded order, stored as offsets from the draft ids
        picked = torch.randperm(int(config["vocab_size"]), generator=gen)[: shape[0]]
        return picked - torch.arange(shape[0])
    return torch.randn(shape, generator=gen) * INIT_STD
