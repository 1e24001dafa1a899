"""The hf engine: a transformers causal LM on CPU (or one GPU), the embedded default policy.

One worker thread owns the model, so the aiohttp event loop never blocks on a forward pass and
two requests never touch the model at once. Requests that arrive while it is busy are batched:
the worker takes everything queued (up to `max_batch` requests and `max_batch_tokens` padded
prompt tokens, so a 30k-token harness prompt runs alone), left-pads the prompts, prefills them in
chunks (attention memory grows with chunk x length, not length squared), and runs one decode loop
with a KV cache, each row with its own temperature, top-p, top-k, seed, stop ids and token
budget. Rows that finish early stop counting; the loop ends when all have.

Weight reloads go through the same queue, so a reload waits for the running batch and every
completion is sampled from exactly one policy version.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawgym.engines.base import EngineConfig, EngineError, Generation, Sampling, context_window, load_policy
from clawgym.errors import UserError


@dataclass
class _Job:
    prompt_ids: list[int]
    sampling: Sampling
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class _Reload:
    path: Path
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


def _cache_of(out: Any) -> Any:
    return out["cache"] if "cache" in out else out.past_key_values


def _resolve(job: Any, result: Any = None, error: BaseException | None = None) -> None:
    def set_() -> None:
        if job.future.done():
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    job.loop.call_soon_threadsafe(set_)


class HFEngine:
    """transformers model behind a batching worker thread; see the module docstring."""

    def __init__(self, model_dir: Path, *, max_batch: int = 8, device: str = "cpu", threads: int | None = None,
                 max_context: int | None = None, max_batch_tokens: int = 65536, prefill_chunk: int = 2048):
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.device = device
        self.max_batch = max_batch
        self.max_batch_tokens = max_batch_tokens
        """rows x padded prompt length per batch: long prompts (harness prompts run 20-40k tokens) go alone"""
        self.prefill_chunk = prefill_chunk
        """prompt tokens per prefill forward: attention memory stays chunk x length, not length^2"""
        self.policy_version = 0
        self.max_context = max_context or context_window(model_dir)
        self.model = self._load(Path(model_dir))
        # transformers 5.2x renamed past_key_values to cache; accept either version.
        import inspect

        self._cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        cfg = self.model.config
        self.pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else 0
        eos = cfg.eos_token_id
        self.eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
        self._jobs: queue.Queue = queue.Queue()
        self._stopped = False
        self._thread = threading.Thread(target=self._work, name="clawgym-hf-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> "HFEngine":
        o = config.options
        return cls(config.model_dir, max_batch=int(o.get("max_batch", 8)), device=o.get("device", "cpu"),
                   threads=o.get("threads"), max_context=o.get("max_context"),
                   max_batch_tokens=int(o.get("max_batch_tokens", 65536)), prefill_chunk=int(o.get("prefill_chunk", 2048)))

    def _load(self, path: Path):
        return load_policy(path, self.device)

    # -- public API (event-loop side) ------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], sampling: Sampling, rollout_id: str = "") -> Generation:
        if self._stopped:
            raise EngineError("the hf engine is shut down")
        if not prompt_ids:
            raise EngineError("empty prompt")
        loop = asyncio.get_running_loop()
        job = _Job(list(prompt_ids), sampling, loop.create_future(), loop)
        self._jobs.put(job)
        return await job.future

    async def reload(self, checkpoint_dir: Path) -> int:
        loop = asyncio.get_running_loop()
        job = _Reload(Path(checkpoint_dir), loop.create_future(), loop)
        self._jobs.put(job)
        return await job.future

    async def close(self) -> None:
        self._stopped = True
        self._jobs.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10)

    # -- worker thread ---------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch and isinstance(batch[-1], _Job):
                try:
                    nxt = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._jobs.put(None)
                    break
                batch.append(nxt)
            for gens in self._pack([j for j in batch if isinstance(j, _Job)]):
                try:
                    results = self._generate_batch(gens)
                except Exception as e:  # an engine crash must reach the callers, not kill the thread
                    for j in gens:
                        _resolve(j, error=EngineError(f"hf engine failed: {type(e).__name__}: {e}"))
                else:
                    for j, r in zip(gens, results):
                        _resolve(j, r)
            for r in (j for j in batch if isinstance(j, _Reload)):
                try:
                    self.model = self._load(r.path)
                    self.policy_version += 1
                    _resolve(r, self.policy_version)
                except Exception as e:
                    _resolve(r, error=e if isinstance(e, UserError) else UserError(f"reload from {r.path} failed: {e}"))

    def _pack(self, jobs: list[_Job]) -> list[list[_Job]]:
        """Split jobs into batches of at most max_batch_tokens padded prompt tokens (similar lengths together)."""
        out: list[list[_Job]] = []
        for j in sorted(jobs, key=lambda j: len(j.prompt_ids)):
            if out and (len(out[-1]) + 1) * len(j.prompt_ids) <= self.max_batch_tokens:
                out[-1].append(j)
            else:
                out.append([j])
        return out

    def _generate_batch(self, jobs: list[_Job]) -> list[Generation]:
        import torch

        B = len(jobs)
        L = max(len(j.prompt_ids) for j in jobs)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, L), dtype=torch.long)
        for i, j in enumerate(jobs):  # left padding: every row's next token sits at column L
            n = len(j.prompt_ids)
            ids[i, L - n:] = torch.tensor(j.prompt_ids)
            mask[i, L - n:] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        gens = [self._generator(j.sampling) for j in jobs]
        stops = [set(j.sampling.stop_token_ids) | set(self.eos_ids) for j in jobs]
        out_ids: list[list[int]] = [[] for _ in jobs]
        out_lp: list[list[float]] = [[] for _ in jobs]
        finish = [""] * B
        budget = [max(0, j.sampling.max_tokens) for j in jobs]
        for i in range(B):
            if budget[i] == 0:
                finish[i] = "length"
        version = self.policy_version
        # The attention mask for the prompt and every token to come, on the device once: each decode
        # step takes a longer view of it instead of copying a growing mask (quadratic on long prompts).
        full_mask = torch.ones((B, L + max(budget)), dtype=torch.long, device=self.device)
        full_mask[:, :L] = mask.to(self.device)
        n = L
        with torch.inference_mode():
            cache = None
            for s in range(0, L, self.prefill_chunk):  # chunked prefill, each chunk attending to the cache
                e = min(L, s + self.prefill_chunk)
                extra = {self._cache_arg: cache} if cache is not None else {}
                out = self.model(input_ids=ids[:, s:e].to(self.device), attention_mask=full_mask[:, :e],
                                 position_ids=pos[:, s:e].to(self.device), use_cache=True, logits_to_keep=1, **extra)
                cache = _cache_of(out)
            logits, last_pos = out.logits[:, -1, :].float(), pos[:, -1]
            while not all(finish):
                nxt = torch.full((B,), self.pad_id, dtype=torch.long)
                for i, j in enumerate(jobs):
                    if finish[i]:
                        continue
                    tok, lp = self._sample(logits[i], j.sampling, gens[i])
                    out_ids[i].append(tok)
                    out_lp[i].append(lp)
                    nxt[i] = tok
                    if tok in stops[i]:
                        finish[i] = "stop"
                    elif len(out_ids[i]) >= budget[i]:
                        finish[i] = "length"
                if all(finish):
                    break
                n += 1
                last_pos = last_pos + 1
                out = self.model(input_ids=nxt[:, None].to(self.device), attention_mask=full_mask[:, :n],
                                 position_ids=last_pos[:, None].to(self.device), use_cache=True,
                                 **{self._cache_arg: cache})
                cache, logits = _cache_of(out), out.logits[:, -1, :].float()
        return [Generation(out_ids[i], out_lp[i], finish[i], version) for i in range(B)]

    @staticmethod
    def _generator(s: Sampling):
        import torch

        if s.seed is None:
            return None
        g = torch.Generator()
        g.manual_seed(int(s.seed))
        return g

    @staticmethod
    def _sample(logits, s: Sampling, gen) -> tuple[int, float]:
        """One token from one row's logits; the logprob is under logits / temperature (untruncated)."""
        import torch

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
