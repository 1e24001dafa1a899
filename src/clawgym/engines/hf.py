"""The hf engine: a transformers causal LM on CPU (or one GPU), the embedded default policy.

One worker thread owns the model, so the aiohttp event loop never blocks on a forward pass and
two requests never touch the model at once. It batches continuously at the decode step: between
two steps it admits the requests that arrived meanwhile (up to `max_batch` rows and
`max_batch_tokens` rows x cache width, so a 30k-token harness prompt runs alone), prefills them in
chunks (attention memory grows with chunk x length, not length squared) and joins their KV cache
to the running batch's. Each row keeps its own temperature, top-p, top-k, seed, stop ids, token
budget and position ids, and answers as soon as it finishes, so a request that arrives while a
long generation runs waits for one decode step, not for the whole batch.

Joining caches (`hf_cache.py`): rows sit right-aligned in one KV cache, so batches join and
finished rows are cut without recomputing anything, for plain full-attention caches; any other
cache (sliding windows, state-space layers) keeps the batch as it started, and new requests wait
until it ends. The batch's rows, admission and per-row sampling are in `hf_batching.py`. Padding
changes no row's result beyond float rounding (tests/engines/test_engines.py checks a late request
against the same request run alone).

Prefix cache (`prefix_cache.py`): before a prefill, each request looks up the longest run of
cached blocks at the start of its prompt (keyed by token ids, shared by every rollout) and computes
only the tokens after it; the prompt's blocks, and at the end the blocks of prompt + output, are
stored for later requests. Rows whose cached lengths differ prefill together in one right-aligned
layout: the batch's past columns hold each row's cached keys/values (left-padded), and every row
forwards the same number of new columns, so a row with a longer cached part recomputes some of it
(never more than the longest suffix; requests whose suffixes differ a lot prefill in separate
groups and join afterwards). Requests admitted together that share a prefix nobody has cached
yet prefill in turn: the first computes it, the others find it. Non-joinable caches turn the
prefix cache off (logged once). A reload drops the whole cache.

Shared-prefix decode attention (`shared_attention.py`): the rows of a batch (a GRPO group, or several
tasks of one harness) usually agree on thousands of leading prompt tokens, of which every row holds a
copy. A decode step reads those keys and values once, from one row, instead of once per row; where
the rows share too little, or the model does not attend with SDPA, attention is transformers' own.

Weight reloads go through the same queue: a reload waits for the running batch, and requests
behind it wait for the reload, so every completion is sampled from exactly one policy version.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from clawgym.engines import shared_attention
from clawgym.engines.base import EngineConfig, EngineError, Generation, Sampling, context_window, load_policy
from clawgym.engines.hf_batching import (Batch, Job, Reload, Row, admissible, join_batches, prefill_groups, resolve,
                                         row_generator, sample_token, select_rows)
from clawgym.engines.hf_cache import cache_of, capacity, growing, joinable, plain_attention
from clawgym.engines.prefix_cache import PrefixCache, PrefixCacheStats, PrefixHit, default_budget
from clawgym.engines.threads import ThreadTuner, decode_kind
from clawgym.engines.weight_layout import WEIGHT_LAYOUTS, pack_linears
from clawgym.errors import UserError

log = logging.getLogger("clawgym.engines.hf")


class HFEngine:
    """transformers model behind a continuously batching worker thread; see the module docstring."""

    def __init__(self, model_dir: Path, *, max_batch: int = 8, device: str = "cpu", threads: int | None = None,
                 max_context: int | None = None, max_batch_tokens: int = 65536, prefill_chunk: int = 2048,
                 late_admission: bool = True, prefix_cache: bool = True, prefix_cache_bytes: int | None = None,
                 prefix_block: int = 32, adaptive_threads: bool = True, weight_layout: str = "packed",
                 shared_attention: bool = True):
        import torch

        self.tuner = ThreadTuner(int(threads or torch.get_num_threads()), adaptive=adaptive_threads and device == "cpu")
        """threads per forward: 1 or `threads` (default torch's), whichever runs faster now (threads.py)"""
        self.device = device
        self.max_batch = max_batch
        self.max_batch_tokens = max_batch_tokens
        """rows x cache width per batch: long prompts (harness prompts run 20-40k tokens) go alone"""
        self.prefill_chunk = prefill_chunk
        """prompt tokens per prefill forward: attention memory stays chunk x length, not length^2"""
        self.late_admission = late_admission
        """False: requests that arrive mid-batch wait for it to end (the baseline bench/hf_batching.py measures)"""
        self.decode_steps = 0
        """decode forwards run so far (tests wait on it to send a request mid-generation)"""
        self.timing = {"prefill_seconds": 0.0, "decode_seconds": 0.0, "decode_tokens": 0.0, "shared_decode_steps": 0.0}
        """forward time, rows decoded and decode steps that read a shared prefix once, so far"""
        self.policy_version = 0
        self.max_context = max_context or context_window(model_dir)
        self.prefix: PrefixCache | None = None
        """the shared prefix KV cache (None: off, or the model's cache cannot be joined)"""
        if prefix_cache:
            budget = default_budget(device) if prefix_cache_bytes is None else int(prefix_cache_bytes)
            self.prefix = PrefixCache(budget, int(prefix_block)) if budget > 0 else None
        self._stats = self.prefix.stats if self.prefix else PrefixCacheStats(enabled=False)
        if weight_layout not in WEIGHT_LAYOUTS:
            raise UserError(f"engine option weight_layout={weight_layout!r}: give one of {', '.join(WEIGHT_LAYOUTS)}")
        self.shared_attention = shared_attention
        """decode steps read the rows' shared prefix once (shared_attention.py); off where the model does not run SDPA"""
        self.weight_layout = weight_layout
        """`packed`: on a CPU, linear weights also held in oneDNN's blocked layout (weight_layout.py); `rows`: as loaded"""
        self._requeue: list[Job] = []
        """admitted jobs a prefill gave back (the prefix cache turned off under them); they go first again"""
        self._jobs: queue.Queue = queue.Queue()
        self._stopped = False
        # The worker thread loads the weights too, so that every torch forward of the engine, the load's
        # included, runs in one thread: one OpenMP thread pool (docs/engines.md, Threads).
        loaded: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._work, args=(Path(model_dir), loaded), name="clawgym-hf-engine", daemon=True)
        self._thread.start()
        self.model = loaded.result()
        # transformers 5.2x renamed past_key_values to cache; accept either version.
        import inspect

        self._cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        cfg = self.model.config
        self.pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else 0
        eos = cfg.eos_token_id
        self.eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
        if self.prefix is not None and not plain_attention(self.model.config):
            self._turn_off_prefix("sliding-window or other layers")

    @classmethod
    def from_config(cls, config: EngineConfig) -> "HFEngine":
        o = config.options

        def count(key: str, default: int | None, least: int) -> int | None:
            v = o.get(key, default)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise UserError(f"engine option {key}={v!r}: give a whole number >= {least}")
            return v

        return cls(config.model_dir, max_batch=int(o.get("max_batch", 8)), device=o.get("device", "cpu"),
                   threads=o.get("threads"), max_context=o.get("max_context"),
                   max_batch_tokens=int(o.get("max_batch_tokens", 65536)), prefill_chunk=int(o.get("prefill_chunk", 2048)),
                   late_admission=bool(o.get("late_admission", True)), prefix_cache=bool(o.get("prefix_cache", True)),
                   prefix_cache_bytes=count("prefix_cache_bytes", None, 0), prefix_block=count("prefix_block", 32, 1),
                   adaptive_threads=bool(o.get("adaptive_threads", True)), weight_layout=str(o.get("weight_layout", "packed")),
                   shared_attention=bool(o.get("shared_attention", True)))

    def _load(self, path: Path):
        model = load_policy(path, self.device)
        if self.weight_layout == "packed" and self.device == "cpu":
            pack_linears(model)
        if self.shared_attention and not shared_attention.enable(model):
            log.info("hf engine: %s does not attend with SDPA; shared-prefix decode attention off",
                     type(model).__name__)
            self.shared_attention = False
        return model

    # -- public API (event-loop side) ------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], sampling: Sampling, rollout_id: str = "") -> Generation:
        if self._stopped:
            raise EngineError("the hf engine is shut down")
        if not prompt_ids:
            raise EngineError("empty prompt")
        loop = asyncio.get_running_loop()
        job = Job(list(prompt_ids), sampling, loop.create_future(), loop)
        self._jobs.put(job)
        return await job.future

    async def reload(self, checkpoint_dir: Path) -> int:
        loop = asyncio.get_running_loop()
        job = Reload(Path(checkpoint_dir), loop.create_future(), loop)
        self._jobs.put(job)
        return await job.future

    async def drop_cache(self) -> int:
        """Drop the prefix cache once the running batch ends (like a reload, without new weights); the bytes freed."""
        loop = asyncio.get_running_loop()
        job = Reload(None, loop.create_future(), loop)
        self._jobs.put(job)
        return await job.future

    def stats(self) -> dict[str, float]:
        """The prefix cache's counters and size (`PrefixCacheStats.as_metrics`) and the forwards' time
        (prefill_seconds, decode_seconds, decode_tokens, decode_steps, shared_decode_steps), for the proxy's metrics."""
        snap = self.prefix.snapshot() if self.prefix else PrefixCacheStats(**self._stats.__dict__)
        snap.enabled = self.prefix is not None
        return {**snap.as_metrics(), **self.timing, "decode_steps": float(self.decode_steps)}

    async def close(self) -> None:
        self._stopped = True
        self._jobs.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10)

    # -- worker thread ---------------------------------------------------------------------------

    def _work(self, model_dir: Path, loaded: concurrent.futures.Future) -> None:
        try:
            loaded.set_result(self._load(model_dir))
        except BaseException as e:  # the constructor raises it
            loaded.set_exception(e)
            return
        waiting: deque = deque()  # arrivals in order: jobs, reloads, None (shut down)
        batch: Batch | None = None
        while True:
            if batch is None and not waiting:
                waiting.append(self._jobs.get())  # idle: block until something arrives
            while True:
                try:
                    waiting.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            if self._stopped:
                # Closing: what still runs is abandoned, so no torch work outlives the engine (a daemon
                # thread inside torch at interpreter exit aborts the process).
                for job in [r.job for r in batch.rows if not r.finish] if batch else []:
                    resolve(job, error=EngineError("the hf engine is shut down"))
                for job in waiting:
                    if job is not None:
                        resolve(job, error=EngineError("the hf engine is shut down"))
                return
            if batch is None:
                while waiting and isinstance(waiting[0], Reload):
                    self._reload(waiting.popleft())
                if waiting and waiting[0] is None:
                    return
            if batch is None or (self.late_admission and joinable(batch.cache)):
                rows = len(batch.rows) if batch else 0
                new = admissible(waiting, rows, batch.width if batch else 0, self.max_batch, self.max_batch_tokens)
                batch = self._admit(batch, new)
                waiting.extendleft(reversed(self._requeue))  # jobs a prefill could not take, first in line again
                self._requeue.clear()
            if batch is not None:
                batch = self._step(batch)

    def _reload(self, r: Reload) -> None:
        """New weights and an empty prefix cache (keys/values of the old weights must never serve the new
        version); with no path, only the empty cache (`drop_cache`: answers the bytes freed)."""
        if r.path is None:
            resolve(r, self._drop_prefix())
            return
        try:
            self.model = self._load(r.path)
            self._drop_prefix()
            self.policy_version += 1
            resolve(r, self.policy_version)
        except Exception as e:
            resolve(r, error=e if isinstance(e, UserError) else UserError(f"reload from {r.path} failed: {e}"))

    def _drop_prefix(self) -> int:
        """Empty the prefix cache; the bytes it held."""
        if self.prefix is None:
            return 0
        freed = self.prefix.snapshot().bytes
        self.prefix.clear()
        return freed

    def _admit(self, batch: Batch | None, jobs: list[Job]) -> Batch | None:
        """Prefill `jobs` and join them to the running batch (a failure fails only these jobs)."""
        for j in [j for j in jobs if j.sampling.max_tokens <= 0]:
            resolve(j, Generation([], [], "length", self.policy_version))
        jobs = [j for j in jobs if j.sampling.max_tokens > 0]
        if not jobs:
            return batch
        try:
            new = self._prefill(jobs)
            return new if batch is None else join_batches(batch, new)
        except Exception as e:  # an engine crash must reach the callers, not kill the thread
            for j in jobs:
                resolve(j, error=EngineError(f"hf engine failed: {type(e).__name__}: {e}"))
            return batch

    def _prefill(self, jobs: list[Job]) -> Batch:
        """Prefill `jobs` into one batch, each from the longest cached prefix of its prompt."""
        if self.prefix is None:
            return self._prefill_group([(j, PrefixHit(0)) for j in jobs])
        batch: Batch | None = None
        pending = jobs
        while pending:  # a job whose next uncached block an earlier job of this pass computes waits a pass
            now, later, claimed = [], [], set()
            for j in pending:
                if self.prefix is None:  # turned off by this admission's first prefill: wait for that batch
                    self._requeue.append(j)
                    continue
                hit = self.prefix.lookup(j.prompt_ids, len(j.prompt_ids) - 1)
                keys = self.prefix.keys(j.prompt_ids, len(j.prompt_ids) // self.prefix.block)[hit.tokens // self.prefix.block:]
                if keys and keys[0] in claimed:
                    later.append(j)
                else:
                    now.append((j, hit))
                    claimed.update(keys)
            for group in prefill_groups(now):
                if self.prefix is None and batch is not None:  # turned off by the group before: cannot join it
                    self._requeue.extend(j for j, _ in group)
                    continue
                new = self._prefill_group(group)
                batch = new if batch is None else join_batches(batch, new)
            pending = later
        assert batch is not None
        return batch

    def _prefill_group(self, items: list[tuple[Job, PrefixHit]]) -> Batch:
        """One prefill forward (chunked) for rows that each start from their cached prefix.

        Layout: rows right-aligned over width W = longest prompt; the last S columns (S = longest
        uncached suffix) are forwarded, the W - S before them come from the cache. Row j uses the
        first max(0, L_j - S) tokens of its cached prefix, which never exceeds what is cached.
        """
        import torch
        from transformers.cache_utils import DynamicCache

        B = len(items)
        lens = [len(j.prompt_ids) for j, _ in items]
        W = max(lens)
        S = max(n - h.tokens for n, (_, h) in zip(lens, items))
        P = W - S
        ids = torch.full((B, W), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, W), dtype=torch.long)
        for i, (j, _) in enumerate(items):  # left padding: every row's next token sits at column W
            ids[i, W - lens[i]:] = torch.tensor(j.prompt_ids)
            mask[i, W - lens[i]:] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        mask = mask.to(self.device)
        cache = None
        if P > 0:  # the past columns: each row's cached blocks, left-padded with masked zeros
            first = next(h.blocks[0] for _, h in items if h.blocks)
            nl, _, heads, blk, hd = first.shape
            past = first.new_empty((nl, 2, B, heads, capacity(W), hd))  # room for the prompt's suffix and the output
            for i, (_, h) in enumerate(items):
                use, col = max(0, lens[i] - S), P - max(0, lens[i] - S)
                past[:, :, i, :, :col] = 0
                for b, t in enumerate(h.blocks):
                    n = min(blk, use - b * blk)
                    if n <= 0:
                        break
                    past[:, :, i, :, col + b * blk: col + b * blk + n] = t[:, :, :, :n]
            cache = growing(DynamicCache(ddp_cache_data=[(past[layer, 0, :, :, :0], past[layer, 1, :, :, :0])
                                                         for layer in range(nl)]))
            for layer, kv in zip(cache.layers, past):  # the chunks' keys/values are then written in place
                layer.adopt(kv[0], kv[1], P)
        with torch.inference_mode():
            for s in range(P, W, self.prefill_chunk):  # chunked prefill, each chunk attending to the cache
                e = min(W, s + self.prefill_chunk)
                extra = {self._cache_arg: cache} if cache is not None else {}
                n, t0 = self.tuner.pick("prefill", B * (e - s)), time.perf_counter()
                out = self.model(input_ids=ids[:, s:e].to(self.device), attention_mask=mask[:, :e],
                                 position_ids=pos[:, s:e].to(self.device), use_cache=True, logits_to_keep=1, **extra)
                dt = time.perf_counter() - t0
                self.tuner.record("prefill", n, dt, B * (e - s))
                self.timing["prefill_seconds"] += dt
                cache = cache_of(out)
        for i, (j, h) in enumerate(items):
            used = max(0, lens[i] - S)
            self._stats.requests += 1
            self._stats.requests_hit += used > 0
            self._stats.prompt_tokens += lens[i]
            self._stats.prompt_tokens_cached += used
            self._stats.prompt_tokens_computed += lens[i] - used
        if self.prefix is not None:
            if not joinable(cache):
                self._turn_off_prefix(", ".join(sorted({type(x).__name__ for x in getattr(cache, "layers", [])}))
                                      or type(cache).__name__)
            else:
                for i, (j, h) in enumerate(items):
                    self._store(cache, i, W - lens[i], j.prompt_ids)
        rows = [Row(j, row_generator(j.sampling), set(j.sampling.stop_token_ids) | set(self.eos_ids),
                     len(j.prompt_ids) - 1) for j, _ in items]
        return Batch(rows, growing(cache), mask, out.logits[:, -1, :].float())

    def _turn_off_prefix(self, what: str) -> None:
        log.warning("hf engine: this model's KV cache (%s) cannot be joined or cut by rows; prefix cache off", what)
        assert self.prefix is not None
        self._stats = PrefixCacheStats(**self.prefix.stats.__dict__)
        self._stats.enabled = False
        self.prefix = None

    def _store(self, cache: Any, row: int, offset: int, ids: list[int]) -> None:
        """Put the full blocks of `ids` (row `row`'s tokens, from cache column `offset`) into the prefix cache."""
        import torch

        def kv_of(s: int, e: int):
            return torch.stack([torch.stack((layer.keys[row, :, offset + s:offset + e], layer.values[row, :, offset + s:offset + e]))
                                for layer in cache.layers])

        assert self.prefix is not None
        self.prefix.insert(ids, kv_of)

    def _step(self, batch: Batch) -> Batch | None:
        """Sample one token per row, answer finished rows, forward the rest one step."""
        import torch

        version = self.policy_version
        for i, r in enumerate(batch.rows):
            if r.finish:  # a finished row of a cache that cannot be cut rides along until the batch ends
                continue
            if r.job.future.cancelled():  # its caller is gone (a harness killed on timeout): stop generating
                r.finish = "cancelled"
                continue
            tok, lp = sample_token(batch.logits[i], r.job.sampling, r.generator)
            r.ids.append(tok)
            r.logprobs.append(lp)
            if tok in r.stops:
                r.finish = "stop"
            elif len(r.ids) >= r.job.sampling.max_tokens:
                r.finish = "length"
            if r.finish:
                resolve(r.job, Generation(r.ids, r.logprobs, r.finish, version))
                if self.prefix is not None and len(r.ids) > 1 and joinable(batch.cache):
                    # the next call of this rollout starts with prompt + output: cache what was forwarded
                    seq = r.job.prompt_ids + r.ids[:-1]
                    self._store(batch.cache, i, batch.width - len(seq), seq)
        keep = [i for i, r in enumerate(batch.rows) if not r.finish]
        if not keep:
            return None
        if len(keep) < len(batch.rows) and joinable(batch.cache):
            batch = select_rows(batch, keep)
        try:
            nxt = torch.tensor([[self.pad_id if r.finish else r.ids[-1]] for r in batch.rows], device=self.device)
            for r in batch.rows:
                r.pos += 1
            batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=1)
            kind = decode_kind(len(batch.rows))
            extra = {self._cache_arg: batch.cache}
            if self.shared_attention and joinable(batch.cache):
                if batch.shared is None:
                    batch.shared = shared_attention.common_prefix([r.job.prompt_ids for r in batch.rows])
                split = shared_attention.plan(batch.mask, batch.shared)
                if split is not None:
                    extra[shared_attention.PLAN_KWARG] = split
                    self.timing["shared_decode_steps"] += 1
            n, t0 = self.tuner.pick(kind), time.perf_counter()
            with torch.inference_mode():
                out = self.model(input_ids=nxt, attention_mask=batch.mask, use_cache=True,
                                 position_ids=torch.tensor([[r.pos] for r in batch.rows], device=self.device), **extra)
            dt = time.perf_counter() - t0
            self.tuner.record(kind, n, dt)
            self.timing["decode_seconds"] += dt
            self.timing["decode_tokens"] += sum(not r.finish for r in batch.rows)
            batch.cache, batch.logits = cache_of(out), out.logits[:, -1, :].float()
            self.decode_steps += 1
            return batch
        except Exception as e:  # an engine crash must reach the callers, not kill the thread
            for r in batch.rows:
                resolve(r.job, error=EngineError(f"hf engine failed: {type(e).__name__}: {e}"))
            return None
