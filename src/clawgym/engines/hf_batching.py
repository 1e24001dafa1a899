"""The hf engine's running batch: its requests (rows), who joins it, how rows are joined and cut,
and how each row samples its next token.

Admission is first come, first served, up to `max_batch` rows and `max_batch_tokens` rows x cache
width (`admissible`); requests whose uncached prompt suffixes differ a lot prefill in separate
groups (`prefill_groups`). Each row keeps its own sampling settings, seed (`row_generator`),
stop ids and budget, and is answered through its future as soon as it finishes (`resolve`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from clawgym.engines.base import Sampling
from clawgym.engines.hf_cache import into_buffers, left_pad


@dataclass
class Job:
    prompt_ids: list[int]
    sampling: Sampling
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class Reload:
    path: Path | None
    """None: drop the prefix cache only (`drop_cache`)"""
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class Row:
    """One request in the running batch."""

    job: Job
    generator: Any
    stops: set[int]
    pos: int
    """position id of the row's last token in the cache"""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = ""


@dataclass
class Batch:
    """The running batch: rows, their joint KV cache, its attention mask [B, width] and the next logits [B, V]."""

    rows: list[Row]
    cache: Any
    mask: Any
    logits: Any
    shared: int | None = None
    """leading prompt tokens every row agrees on (None: not counted since the rows last changed)"""

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])



def resolve(job: Any, result: Any = None, error: BaseException | None = None) -> None:
    def set_() -> None:
        if job.future.done():
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    job.loop.call_soon_threadsafe(set_)



def admissible(waiting: deque, rows: int, width: int, max_batch: int, max_batch_tokens: int) -> list[Job]:
    """Pop the jobs at the head of `waiting` that join a batch of `rows` rows and cache `width`.

    First come, first served: admission stops at a reload, a shutdown marker or the first job that
    would push rows x width past `max_batch_tokens`; an empty batch always takes its first job.
    """
    taken: list[Job] = []
    while waiting and isinstance(waiting[0], Job) and rows + len(taken) < max_batch:
        n = rows + len(taken) + 1
        w = max(width, len(waiting[0].prompt_ids))
        if n > 1 and n * w > max_batch_tokens:
            break
        width = w
        taken.append(waiting.popleft())
    return taken


def prefill_groups(items: list, slack: int = 32) -> list[list]:
    """Split (job, hit) pairs into prefill groups: a joint prefill forwards every row's longest
    suffix, so a row joins a group only while that costs at most 25% more than the rows' own
    suffixes (plus `slack` tokens a row, about what one more forward's fixed cost buys on a CPU);
    longest suffixes first."""
    def suffix(it) -> int:
        return len(it[0].prompt_ids) - it[1].tokens

    groups: list[list] = []
    for it in sorted(items, key=suffix, reverse=True):
        g = groups[-1] if groups else None
        if g is not None and suffix(g[0]) * (len(g) + 1) <= 1.25 * (sum(map(suffix, g)) + suffix(it)) + slack * (len(g) + 1):
            g.append(it)
        else:
            groups.append([it])
    return groups



def join_batches(a: Batch, b: Batch) -> Batch:
    """One batch of a's rows then b's: the narrower cache is left-padded with masked zeros."""
    width = max(a.width, b.width)
    for la, lb in zip(a.cache.layers, b.cache.layers):  # keys/values are [B, heads, T, head_dim]
        into_buffers(la, [(la.keys, la.values), (lb.keys, lb.values)], width)
    mask = torch.cat([left_pad(a.mask, width, 1), left_pad(b.mask, width, 1)])
    return Batch(a.rows + b.rows, a.cache, mask, torch.cat([a.logits, b.logits]))



def select_rows(batch: Batch, keep: list[int]) -> Batch:
    """The batch cut to rows `keep`, without the leading columns only padding uses any more."""
    idx = torch.tensor(keep, device=batch.mask.device)
    mask = batch.mask.index_select(0, idx)
    start = int(mask.any(0).nonzero()[0])
    for layer in batch.cache.layers:
        into_buffers(layer, [(layer.keys[i:i + 1, :, start:], layer.values[i:i + 1, :, start:]) for i in keep],
                     mask.shape[1] - start)
    return Batch([batch.rows[i] for i in keep], batch.cache, mask[:, start:], batch.logits.index_select(0, idx))

def row_generator(s: Sampling):
    if s.seed is None:
        return None
    g = torch.Generator()
    g.manual_seed(int(s.seed))
    return g

def sample_token(logits, s: Sampling, gen) -> tuple[int, float]:
    """One token from one row's logits; the logprob is under logits / temperature (untruncated)."""
    temp = s.temperature if s.temperature and s.temperature > 0 else 1.0
    logp = torch.log_softmax(logits / temp, dim=-1)
    if not s.temperature or s.temperature <= 0:
        tok = int(torch.argmax(logp))
        return tok, float(logp[tok])
    probs = logp.exp()
    if s.top_k and s.top_k > 0:
        kth = torch.topk(probs, min(s.top_k, probs.numel())).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if s.top_p < 1.0:
        sp, si = torch.sort(probs, descending=True)
        keep = torch.cumsum(sp, 0) - sp < s.top_p * sp.sum()
        probs = torch.zeros_like(probs).scatter(0, si[keep], sp[keep])
    tok = int(torch.multinomial(probs, 1, generator=gen))
    return tok, float(logp[tok])
