"""Prompt prefixes computed before: their keys and values, reused instead of prefilled again.

A prompt is cut into blocks of ``block_tokens`` tokens. A block is keyed by the SHA-256 of its parent's key
and its tokens (so by the whole prefix up to its end: two prompts share a block only when every token
before it is the same; a cryptographic hash, so one tenant cannot craft a prompt that collides with
another's), and holds that block's keys and values of every layer. A prompt's lookup walks its blocks from
the first and stops at the first miss; the request then prefills only the tokens after the hit. A prompt's
blocks are stored as its prefill covers them, chunk by chunk, so a request that arrives while another with
the same system prompt is still prefilling reuses what is done.

Blocks are held in a budget of their own (``budget_tokens`` token slots per layer, beside the running
batch's ``kv_cache_tokens``) and evicted least recently used. A lookup marks a prompt's blocks from the
last to the first, so a parent is always more recent than its children and eviction takes leaves first (a
child whose parent is gone could never be hit again). One cache belongs to one engine, which runs one
version of one model: nothing is shared across models or versions.
"""

from __future__ import annotations

import array
import collections
import hashlib
import threading
from dataclasses import dataclass

import torch
from transformers import DynamicCache

Key = bytes  # sha256(parent key + the block's tokens)


@dataclass(frozen=True, slots=True)
class PrefixStats:
    blocks_used: int
    blocks_total: int
    block_tokens: int
    hit_tokens: int  # prompt tokens served from the cache, since start
    prompt_tokens: int  # prompt tokens looked up, since start


@dataclass(slots=True)
class _Block:
    keys: list[torch.Tensor]  # per layer: (heads, block_tokens, dim)
    values: list[torch.Tensor]


class PrefixCache:
    def __init__(self, block_tokens: int, budget_tokens: int) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        self.block_tokens = block_tokens
        self.capacity = budget_tokens // block_tokens  # blocks
        self._blocks: collections.OrderedDict[Key, _Block] = collections.OrderedDict()
        self._lock = threading.Lock()  # stats() is read from the metrics thread
        self._hit_tokens = 0
        self._prompt_tokens = 0

    def lookup(self, prompt: list[int], cache: DynamicCache) -> int:
        """Write the longest cached prefix of ``prompt`` that leaves at least one token to prefill (its logits
        give the first new token) into ``cache``, an empty one-row cache; how many tokens it covers."""
        found: list[tuple[Key, _Block]] = []
        if self.capacity:
            for key in self._keys(prompt, (len(prompt) - 1) // self.block_tokens):
                block = self._blocks.get(key)
                if block is None:
                    break
                found.append((key, block))
        with self._lock:
            self._prompt_tokens += len(prompt)
            self._hit_tokens += len(found) * self.block_tokens
        for key, _ in reversed(found):  # the last block first: parents stay more recent than children
            self._blocks.move_to_end(key)
        for _, block in found:  # block by block: a cache filled in place copies each once
            for layer, keys, values in zip(cache.layers, block.keys, block.values, strict=False):
                layer.update(keys[None], values[None])
        return len(found) * self.block_tokens

    def store(self, prompt: list[int], cache: DynamicCache, upto: int, start: int = 0) -> None:
        """Keep the blocks of ``prompt[:upto]`` not held yet; ``cache`` holds the prompt's keys and values
        from its column ``start`` (a packed prefill holds several prompts end to end)."""
        if not self.capacity:
            return
        for i, key in enumerate(self._keys(prompt, upto // self.block_tokens)):
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            a, b = start + i * self.block_tokens, start + (i + 1) * self.block_tokens
            block = _Block(
                [layer.keys[0, :, a:b].clone() for layer in cache.layers],
                [layer.values[0, :, a:b].clone() for layer in cache.layers],
            )
            with self._lock:
                while len(self._blocks) >= self.capacity:
                    self._blocks.popitem(last=False)
                self._blocks[key] = block

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()

    def stats(self) -> PrefixStats:
        with self._lock:
            return PrefixStats(
                len(self._blocks), self.capacity, self.block_tokens, self._hit_tokens, self._prompt_tokens
            )

    def _keys(self, prompt: list[int], blocks: int) -> list[Key]:
        keys: list[Key] = []
        parent = b""
        for i in range(blocks):
            tokens = array.array("q", prompt[i * self.block_tokens : (i + 1) * self.block_tokens])
            parent = hashlib.sha256(parent + tokens.tobytes()).digest()
            keys.append(parent)
        return keys
