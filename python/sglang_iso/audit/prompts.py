"""Random prompts for the audit: every prompt is new to the server and shares no prefix with the others.

A guaranteed miss needs a prompt nobody has sent before, and a hit candidate must not share a long prefix with
any earlier prompt (or the "miss" samples would partly hit too). Distinct first words keep any shared prefix to
the one or two tokens a byte-level tokenizer may cut from a common first syllable. Each prompt is a sequence
of random lowercase words; the generator mixes a per-run salt into its seed, so a rerun with the same
``--seed`` never meets a previous run's cache entries.
"""

from __future__ import annotations

import random
import string

WORD_LETTERS = string.ascii_lowercase
MIN_WORD_LEN = 3
MAX_WORD_LEN = 8


class PromptFactory:
    """Makes fresh random prompts of a chosen number of words.

    Args:
        seed: the user's seed (``--seed``).
        salt: per-run randomness mixed into the seed (the CLI passes ``secrets.token_hex``); fixed in unit tests.
        words: words per prompt; :meth:`calibrate` changes it to hit a token target.
    """

    def __init__(self, seed: int, salt: str, words: int = 64) -> None:
        self._rng = random.Random(f"{seed}:{salt}")
        self.words = max(1, words)
        """Words per prompt; mutated only by :meth:`calibrate`."""
        self._issued: set[str] = set()

    def new(self) -> str:
        """A prompt whose first word no earlier prompt of this factory had."""
        for _ in range(100):
            words = [self._word() for _ in range(self.words)]
            if words[0] not in self._issued:
                self._issued.add(words[0])
                return " ".join(words)
        raise RuntimeError(f"could not draw a fresh first word after 100 tries ({len(self._issued)} issued)")

    def calibrate(self, target_tokens: int, measured_tokens: int, measured_words: int) -> int:
        """Set :attr:`words` so that a prompt has about ``target_tokens`` tokens; returns the new word count.

        ``measured_tokens`` is the server's ``prompt_tokens`` for a prompt of ``measured_words`` words.
        """
        if measured_tokens <= 0 or measured_words <= 0:
            raise ValueError(f"need positive measurements, got {measured_tokens=} {measured_words=}")
        self.words = max(1, round(target_tokens * measured_words / measured_tokens))
        return self.words

    def _word(self) -> str:
        n = self._rng.randint(MIN_WORD_LEN, MAX_WORD_LEN)
        return "".join(self._rng.choice(WORD_LETTERS) for _ in range(n))


def initial_words(target_tokens: int) -> int:
    """A first guess of words per prompt (about 4 tokens per random word) before calibration."""
    return max(1, target_tokens // 4)
