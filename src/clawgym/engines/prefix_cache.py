"""A prefix KV cache for the hf engine: keys and values of prompt blocks, found again by token ids.

A token sequence is cut into blocks of `block` tokens. Block i is keyed by a hash chain,
`key_i = blake2b(key_{i-1} || token ids of block i)`, so one key names the block's tokens *and*
everything before it: two prompts share a block's cached keys and values exactly when they agree on
every token up to the end of that block. The stored block also keeps its token ids, and a lookup
compares them, so a hash collision can never serve wrong keys and values. Partial blocks are never
stored: a prompt that leaves a cached conversation inside a block recomputes that block.

Each block holds one tensor `[layers, 2 (keys, values), kv_heads, block, head_dim]`, computed at
the positions the block has in every prompt that contains it (position ids count from the first
token), so a cached block is what a cold prefill of the same prefix computes, up to float rounding.

Eviction is least-recently-used under a byte budget. A lookup or insert touches a chain from its
last block back to its first, so a block is never less recent than any block after it in a chain:
eviction takes the ends of conversations before their shared beginnings, and never strands a
reachable block behind an evicted parent for long. `clear()` drops everything (the engine calls it
on every weight reload: keys and values of old weights must not serve a new policy version).

The cache is not thread-safe; the hf engine uses it from its one worker thread only.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

from clawgym import peak_memory

ROOT = b"clawgym-prefix-root"


@dataclass
class _Block:
    tokens: tuple[int, ...]
    kv: Any
    """tensor [layers, 2, kv_heads, block, head_dim]"""
    nbytes: int


@dataclass(frozen=True)
class PrefixHit:
    """The cached blocks at the start of a prompt, in order; `tokens` = len(blocks) x block size."""

    tokens: int
    blocks: tuple[Any, ...] = ()
    """each a tensor [layers, 2, kv_heads, block, head_dim]"""


@dataclass
class PrefixCacheStats:
    """Counters since the engine started (cumulative) and the cache's present size (gauges)."""

    requests: int = 0
    requests_hit: int = 0
    """requests that reused at least one cached block"""
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    """prompt tokens whose keys and values came from the cache"""
    prompt_tokens_computed: int = 0
    """prompt tokens the model ran a forward over (uncached tokens, plus cached ones a joint prefill redid)"""
    evicted_blocks: int = 0
    evicted_tokens: int = 0
    resets: int = 0
    """times the whole cache was dropped (every weight reload, and every `drop_cache` before training)"""
    cached_blocks: int = 0
    cached_tokens: int = 0
    bytes: int = 0
    budget_bytes: int = 0
    block_tokens: int = 0
    enabled: bool = True

    @property
    def hit_rate(self) -> float:
        """Share of prompt tokens served from the cache."""
        return self.prompt_tokens_cached / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def computed_share(self) -> float:
        """Share of prompt tokens the model computed (1.0 without a cache)."""
        return self.prompt_tokens_computed / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_metrics(self) -> dict[str, float]:
        """Flat numbers for the proxy's metrics endpoint."""
        out = {k: float(v) for k, v in self.__dict__.items()}
        out["hit_rate"] = self.hit_rate
        out["computed_share"] = self.computed_share
        return out


@dataclass
class PrefixCache:
    """Blocks of keys/values keyed by a hash chain of token ids, LRU-evicted under `budget_bytes`."""

    budget_bytes: int
    block: int = 32
    _blocks: OrderedDict = field(default_factory=OrderedDict)
    _bytes: int = 0
    stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)

    def __post_init__(self) -> None:
        if self.block < 1:
            raise ValueError(f"prefix cache block must be at least 1 token, got {self.block}")
        self.stats.budget_bytes = self.budget_bytes
        self.stats.block_tokens = self.block

    def keys(self, ids: Sequence[int], n_blocks: int) -> list[bytes]:
        """The chain keys of the first `n_blocks` full blocks of `ids`."""
        out, parent, b = [], ROOT, self.block
        for i in range(n_blocks):
            parent = hashlib.blake2b(parent + array("q", ids[i * b:(i + 1) * b]).tobytes(), digest_size=16).digest()
            out.append(parent)
        return out

    def _touch(self, keys: list[bytes]) -> None:
        for k in reversed(keys):  # last block first: a chain's start ends up the most recent
            self._blocks.move_to_end(k)

    def lookup(self, ids: Sequence[int], limit: int) -> PrefixHit:
        """The longest run of cached blocks at the start of `ids[:limit]`."""
        b = self.block
        found: list[bytes] = []
        for i, k in enumerate(self.keys(ids, max(0, limit) // b)):
            blk = self._blocks.get(k)
            if blk is None or blk.tokens != tuple(ids[i * b:(i + 1) * b]):
                break
            found.append(k)
        self._touch(found)
        return PrefixHit(len(found) * b, tuple(self._blocks[k].kv for k in found))

    def insert(self, ids: Sequence[int], kv_of: Any) -> int:
        """Store the full blocks of `ids` that are not cached yet; returns how many were stored.

        `kv_of(s, e)` gives a fresh tensor [layers, 2, kv_heads, e - s, head_dim] of tokens s..e-1
        (copied out of the caller's batch cache). The chain is walked from its first block, so blocks
        evicted since the caller's lookup are stored again rather than left unreachable.
        """
        import torch

        b = self.block
        keys = self.keys(ids, len(ids) // b)
        first = 0
        while first < len(keys) and keys[first] in self._blocks:
            first += 1
        if first < len(keys):
            kv = kv_of(first * b, len(keys) * b)
            for j, piece in enumerate(torch.split(kv, b, dim=3)):
                i = first + j
                if keys[i] in self._blocks:  # a chain can rejoin stored blocks only by a collision; keep the old
                    continue
                t = piece.contiguous()  # its own storage (kv_of returns a fresh tensor), so eviction frees it
                blk = _Block(tuple(ids[i * b:(i + 1) * b]), t, t.numel() * t.element_size())
                self._blocks[keys[i]] = blk
                self._bytes += blk.nbytes
        self._touch(keys)
        self._evict(protect=set(keys))
        return max(0, len(keys) - first)

    def _evict(self, protect: set[bytes]) -> None:
        while self._bytes > self.budget_bytes and self._blocks:
            k = next(iter(self._blocks))
            if k in protect:  # the chain just stored is newest; only it is left, so it must shrink too
                protect = set()
            blk = self._blocks.pop(k)
            self._bytes -= blk.nbytes
            self.stats.evicted_blocks += 1
            self.stats.evicted_tokens += self.block

    def clear(self) -> None:
        self._blocks.clear()
        self._bytes = 0
        self.stats.resets += 1

    def snapshot(self) -> PrefixCacheStats:
        """The stats with the present size filled in."""
        self.stats.cached_blocks = len(self._blocks)
        self.stats.cached_tokens = len(self._blocks) * self.block
        self.stats.bytes = self._bytes
        return PrefixCacheStats(**self.stats.__dict__)


def default_budget(device: str) -> int:
    """A quarter of the memory free now: device memory on a GPU; on CPU the room this process has
    (MemAvailable, or less under a cgroup's limit: peak_memory.room)."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free * 0.25)
    free = peak_memory.room()
    if free is not None:
        return free[0] // 4
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
