"""SGLang's own frontend-language example (multi-turn question), unchanged but for where it connects.

Run as a fresh interpreter: ``python multi_turn.py URL API_KEY NONCE`` (the nonce opens the system prompt, so
runs with another nonce share nothing but the chat template's head). It imports ``sglang`` first and nothing from
sglang-iso. It prints one JSON line per run with each answer's ``cached_tokens``.
"""

import json
import sys

import sglang as sgl
from sglang import assistant, function, gen, set_default_backend, system, user


@function
def multi_turn_question(s, nonce, question_1, question_2):
    s += system(nonce + " You are a helpful assistant.")
    s += user(question_1)
    s += assistant(gen("answer_1", max_tokens=16))
    s += user(question_2)
    s += assistant(gen("answer_2", max_tokens=16))


def main() -> None:
    url, api_key, nonce = sys.argv[1], sys.argv[2], sys.argv[3]
    set_default_backend(sgl.RuntimeEndpoint(url, api_key=api_key))
    for _ in range(2):
        state = multi_turn_question.run(
            nonce=nonce,
            question_1="What is the capital of the United States?",
            question_2="List two local attractions.",
            temperature=0,
        )
        print(json.dumps({name: state.get_meta_info(name)["cached_tokens"] for name in ("answer_1", "answer_2")}))


if __name__ == "__main__":
    main()
