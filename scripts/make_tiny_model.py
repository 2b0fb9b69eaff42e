"""Generate the tiny Llama model bundled with sglang-iso (seeded, reproducible).

The model has deterministic random weights: it produces gibberish, but it runs
through the real SGLang model code, allocator and radix cache, which is all the
demo and the tests need. The tokenizer is a byte-level BPE trained here on a
seeded synthetic corpus, so no download is involved.

Usage:
    python scripts/make_tiny_model.py [--out python/sglang_iso/models/tiny-llama]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "python/sglang_iso/models/tiny-llama"
SEED = 20261129
VOCAB_SIZE = 2048
CONTEXT_LENGTH = 8192
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

# Renders roles as <|role|>content<|end|>; ends with <|assistant|> when a reply is expected.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

_SYLLABLES = (
    "ka te ri on an de mo su la vi ne to pa ro mi ga lu ce fa ho bi ze ny qu "
    "ax el or um is ent ion ing ed er al ly st th sh ch"
).split()


def synthetic_corpus(rng: random.Random, lines: int = 6000) -> list[str]:
    """Seeded pseudo-text with words, digits, punctuation and code-like lines."""
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    words += "the a of to and in is you that it for on with as are this be at or have".split()
    out = []
    for _ in range(lines):
        n = rng.randint(4, 24)
        sentence = " ".join(rng.choice(words) for _ in range(n))
        kind = rng.random()
        if kind < 0.1:
            sentence = f"def {rng.choice(words)}(x, y={rng.randint(0, 99)}): return x + y"
        elif kind < 0.2:
            sentence = f"{sentence}: {rng.randint(0, 10**6)} / {rng.random():.4f}!"
        out.append(sentence.capitalize() + rng.choice([".", "?", "!", ","]))
    return out


def build_tokenizer(out: Path, rng: random.Random) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(rng), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|bos|>",
                "eos_token": "<|eos|>",
                "pad_token": "<|pad|>",
                "unk_token": None,
                "add_bos_token": False,
                "model_max_length": CONTEXT_LENGTH,
                "chat_template": CHAT_TEMPLATE,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
        + "\n"
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}, indent=2) + "\n"
    )


def build_model(out: Path) -> None:
    import sys

    # transformers imports torchvision, which needs the CPU shims on this kind of machine.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    from sglang_iso.platform import cpu

    cpu.apply()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=CONTEXT_LENGTH,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=SPECIAL_TOKENS.index("<|bos|>"),
        eos_token_id=SPECIAL_TOKENS.index("<|eos|>"),
        pad_token_id=SPECIAL_TOKENS.index("<|pad|>"),
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}, indent=2) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    build_tokenizer(args.out, rng)
    build_model(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
