"""Prompts of a given token length.

With a tokenizer (``--tokenizer NAME_OR_PATH``, needs ``transformers``): random token ids
decoded to text, re-encoded and cut until the text encodes to exactly N tokens (the way
``vllm bench serve``'s random dataset builds prompts), so the prompt is N tokens for that
tokenizer, before any chat template.

Without one, lengths are approximated: N common three-letter English words, space-separated
(``"the and for ..."``). Each is one token in the Llama-3, Llama-2, Mistral and GPT-4 BPE
vocabularies, and four characters, the emulated engines' rate (``emulator/parsing.py``), so
the text is N tokens give or take the tokenizer's handling of the first word. The chat
template adds its own tokens on top; the report counts what the server said it prefilled
(``usage.prompt_tokens``) whenever the server sends usage.

Each prompt starts with a random tag of the run and its request number (one word each), so a
server's prefix cache does not turn a benchmark of N-token prompts into a benchmark of
cached ones, neither within a run nor across the steps of a sweep.

May touch: the standard library, transformers (optional, imported only with a tokenizer).
"""

from __future__ import annotations

import random
import secrets
from typing import Any, Protocol

WORDS = ("the", "and", "for", "you", "are", "not", "but", "can", "all", "one", "has", "was",
         "her", "his", "out", "new", "see", "now", "who", "get", "how", "its", "may", "day",
         "use", "way", "too", "any", "say", "man", "old", "big", "two", "off", "set", "end")

APPROXIMATION = ("prompt lengths approximated: N common 3-letter words, about one token each "
                 "(4 characters, the emulated engines' rate); pass --tokenizer for exact ones")


class PromptMaker(Protocol):
    exact: bool

    def make(self, tokens: int, index: int) -> str: ...


class WordPrompts:
    """N one-token words (an approximation; see the module docstring)."""

    exact = False

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._tag = secrets.token_hex(2)  # this run's: ~1-2 tokens, 4 characters

    def make(self, tokens: int, index: int) -> str:
        head = [self._tag, f"{index % 1000:03d}"]  # distinct per run and request
        words = self._rng.choices(WORDS, k=max(tokens - len(head), 0))
        return " ".join([*head, *words])


class TokenizerPrompts:
    """Exactly N tokens of the given tokenizer (before any chat template)."""

    exact = True

    def __init__(self, name: str, seed: int = 0) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise ValueError("--tokenizer needs the 'transformers' package installed") from exc
        self._tok: Any = AutoTokenizer.from_pretrained(name)
        self._rng = random.Random(seed)
        self._vocab = int(self._tok.vocab_size)
        self._special = set(getattr(self._tok, "all_special_ids", []) or [])

    def _encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def make(self, tokens: int, index: int) -> str:
        ids = self._encode(f"{secrets.token_hex(2)} {index} ")
        while len(ids) < tokens:
            t = self._rng.randrange(self._vocab)
            if t not in self._special:
                ids.append(t)
        text = self._tok.decode(ids[:tokens])
        for _ in range(8):  # decode/encode round trips can merge or split tokens
            got = self._encode(text)
            if len(got) == tokens:
                return str(text)
            if len(got) > tokens:
                text = self._tok.decode(got[:tokens])
            else:
                text = text + self._tok.decode([self._rng.choice(got or [0])])
        return str(text)


def prompt_maker(tokenizer: str | None, seed: int) -> PromptMaker:
    return TokenizerPrompts(tokenizer, seed) if tokenizer else WordPrompts(seed)
