"""Automatic prefix caching in an emulated engine: block hashes and an LRU of cached blocks.

Both real engines keep the KV of finished prompts and reuse it when a new prompt starts the
same way (vLLM v1's automatic prefix caching, on by default; SGLang's radix cache). The
emulator models vLLM's design, which SGLang's matches closely enough at this level:

* a prompt is cut into blocks of ``BLOCK_TOKENS`` tokens (vLLM's default ``block_size``, 16);
  block i's hash covers blocks 0..i (chained), so equal hashes mean equal prefixes. Only full
  blocks are hashed. The HTTP server derives them from the prompt's text
  (``text_block_hashes``: blake2b over ``BLOCK_CHARS`` characters, the parser's ~4 characters a
  token); the simulator passes synthetic ones;
* at admission the engine looks up the leading blocks it holds; those tokens skip prefill
  (at most ``prompt - 1``: the last token is always computed, as vLLM does); the request then
  holds all its blocks (``hold``) until it finishes, is preempted or aborted (``release``);
* blocks no running request holds stay cached in free KV memory, least recently used first
  out: ``trim(max_free)`` evicts while they exceed the free KV blocks. A released request's
  blocks go back tail first, so a prefix outlives the prompts that extended it (vLLM frees
  blocks in reverse order for the same reason);
* counters in tokens, as vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits``: each
  request counts its prompt as queried and its cached tokens as hits at first admission.

Simplification: a block shared by several running requests is counted in each one's KV (the
real engines store it once), so the emulator understates the memory a shared prefix saves.

May touch: hashlib. Must not touch: clocks, I/O, asyncio.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 16
CHARS_PER_TOKEN = 4  # parsing.py's token count
BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN


def text_block_hashes(text: str, block_chars: int = BLOCK_CHARS) -> tuple[int, ...]:
    """Chained hashes of the full ``block_chars``-character blocks of ``text``."""
    data = text.encode()
    out: list[int] = []
    prev = b""
    for start in range(0, len(data) - block_chars + 1, block_chars):
        prev = hashlib.blake2b(prev + data[start:start + block_chars], digest_size=8).digest()
        out.append(int.from_bytes(prev, "big"))
    return tuple(out)


def chat_text(messages: Sequence[object]) -> str:
    """The text a chat prompt's cache key is computed from: each message's role and text."""
    parts: list[str] = []
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        content = msg.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
        parts.append(f"<|{msg.get('role')}|>{content if isinstance(content, str) else ''}")
    return "".join(parts)


class PrefixCache:
    """Cached block hashes: the ones running requests hold (refcounted) and an LRU of free ones."""

    def __init__(self, block_tokens: int = BLOCK_TOKENS) -> None:
        self.block_tokens = block_tokens
        self._held: dict[int, int] = {}  # hash -> how many running requests hold it
        self._free: OrderedDict[int, None] = OrderedDict()  # evictable, least recent first
        self.queries = self.hits = 0  # tokens, counted once per request

    def __len__(self) -> int:
        return len(self._held) + len(self._free)

    def lookup(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` are cached."""
        n = 0
        for h in hashes:
            if h not in self._held and h not in self._free:
                break
            n += 1
        return n

    def count(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.queries += prompt_tokens
        self.hits += cached_tokens

    def hold(self, hashes: Sequence[int]) -> None:
        held, free = self._held, self._free
        for h in hashes:
            free.pop(h, None)
            held[h] = held.get(h, 0) + 1

    def release(self, hashes: Sequence[int]) -> None:
        held, free = self._held, self._free
        for h in reversed(hashes):  # the tail goes first, so it is evicted first
            left = held.get(h, 0) - 1
            if left > 0:
                held[h] = left
            elif left == 0:
                del held[h]
                free[h] = None  # most recent; the head of the prompt ends up last

    def trim(self, max_free: int) -> None:
        """Evict least recently used free blocks until at most ``max_free`` remain."""
        free = self._free
        while len(free) > max(max_free, 0):
            free.popitem(last=False)
