"""The remote engine: sample from running vLLM or SGLang servers by token ids, over HTTP.

    clawgym serve-proxy --model DIR --engine remote --engine-url http://10.0.0.5:8000,http://10.0.0.6:8000

The proxy still renders every request with the tokenizer in DIR; the servers only ever see token
ids, so what they sample is exactly what gets recorded. Two server dialects:

- vLLM (`vllm serve DIR`): `POST /v1/completions` with `prompt` = the token ids, `logprobs: 0`,
  `return_token_ids: true` (sampled ids come back as ids, never re-tokenized text).
- SGLang (`python -m sglang.launch_server --model-path DIR`): `POST /generate` with `input_ids`
  and `return_logprob: true`; ids and logprobs are read from `meta_info.output_token_logprobs`.

The dialect is taken from the option `server` (vllm | sglang) or detected on first use: SGLang
answers `GET /get_model_info`, vLLM does not.

Several URLs form one pool. Each rollout is routed by rendezvous hashing of its id, so all of a
rollout's calls go to the same replica and its growing prefix stays in that replica's prefix
cache; when a replica stops answering, only its rollouts move (to their next-ranked replica), and
the replica is retried after `retry_after_s`.

Reload (a new checkpoint directory that the servers can read at the same path):
- SGLang: `POST /update_weights_from_disk {"model_path": DIR}` — built in.
- vLLM: `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}` then
  `POST /reset_prefix_cache`; these routes exist only when the server runs with
  `VLLM_SERVER_DEV_MODE=1`. Without them reload fails with an error saying so (restart the server
  on the new checkpoint instead).
"""

from __future__ import annotations

import asyncio
import json
import contextlib
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from clawgym.engines.base import EngineConfig, EngineError, Generation, Sampling, context_window
from clawgym.errors import UserError

SERVERS = ("vllm", "sglang")


class ReplicaUnreachable(EngineError):
    """The replica did not answer at all (refused, reset, timed out): another replica may."""


@dataclass
class Replica:
    url: str
    down_until: float = 0.0
    """monotonic time before which routing skips this replica (after a connection failure)"""


class VersionGate:
    """Generations run concurrently, but never across a weight swap (or while the engine sleeps).

    `hold()` stops new generations and waits for the running ones to finish; `release()` lets
    them start again. So every completion is sampled from exactly one policy version.
    """

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._in_flight = 0
        self._held = False

    @contextlib.asynccontextmanager
    async def generation(self):
        async with self._cond:
            await self._cond.wait_for(lambda: not self._held)
            self._in_flight += 1
        try:
            yield
        finally:
            async with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    async def hold(self) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._held)
            self._held = True
            await self._cond.wait_for(lambda: self._in_flight == 0)

    async def release(self) -> None:
        async with self._cond:
            self._held = False
            self._cond.notify_all()


def parse_urls(value: Any) -> list[str]:
    """'http://a:8000,http://b:8000' or a list -> normalized base URLs (no trailing slash, no /v1)."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    urls = []
    for raw in items:
        u = str(raw).strip().rstrip("/")
        if not u:
            continue
        if not u.startswith(("http://", "https://")):
            raise UserError(f"engine URL '{u}' must start with http:// or https://")
        if u.endswith("/v1"):  # people paste the OpenAI base URL; the engine needs the server root
            u = u[:-3]
        urls.append(u)
    if not urls:
        raise UserError("the remote engine needs --engine-url URL[,URL...] (a running vLLM or SGLang server)")
    return urls


def rank_replicas(rollout_id: str, urls: list[str]) -> list[int]:
    """Replica indices in this rollout's preference order (rendezvous / highest-random-weight hashing).

    A stable hash (not Python's salted `hash`) so that every proxy process, and every restart,
    sends a rollout to the same replica.
    """
    def score(url: str) -> int:
        return int.from_bytes(hashlib.blake2b(f"{url}\0{rollout_id}".encode(), digest_size=8).digest(), "big")

    return sorted(range(len(urls)), key=lambda i: score(urls[i]), reverse=True)


@dataclass
class RemoteEngine:
    """A pool of vLLM/SGLang servers behind the Engine protocol; see the module docstring."""

    model_dir: Path
    urls: list[str]
    server: str = "auto"
    served_model: str | None = None
    """vLLM's model name (default: the first of GET /v1/models)"""
    api_key: str | None = None
    timeout_s: float = 600.0
    retry_after_s: float = 30.0
    max_context: int = 32768
    policy_version: int = 0
    replicas: list[Replica] = field(default_factory=list)
    OPTIONS: ClassVar[tuple[str, ...]] = ("engine_url", "urls", "url", "server", "served_model", "api_key", "timeout_s",
                                          "retry_after_s", "max_context")

    def __post_init__(self) -> None:
        if self.server not in ("auto", *SERVERS):
            raise UserError(f"unknown remote server kind '{self.server}'; choose auto, {' or '.join(SERVERS)}")
        self.replicas = [Replica(u) for u in self.urls]
        self._session = None
        self._detect_lock: asyncio.Lock | None = None
        self._gate = VersionGate()
        self._rr = 0

    @classmethod
    def from_config(cls, config: EngineConfig) -> "RemoteEngine":
        o = config.options
        unknown = set(o) - set(cls.OPTIONS) - {"script", "max_batch", "device", "threads"}  # other engines' options
        if unknown:
            raise UserError(f"unknown remote engine option(s): {', '.join(sorted(unknown))}; known: {', '.join(cls.OPTIONS)}")
        urls = parse_urls(o.get("engine_url") or o.get("urls") or o.get("url"))
        return cls(Path(config.model_dir), urls, server=str(o.get("server", "auto")), served_model=o.get("served_model"),
                   api_key=o.get("api_key"), timeout_s=float(o.get("timeout_s", 600.0)),
                   retry_after_s=float(o.get("retry_after_s", 30.0)),
                   max_context=int(o.get("max_context") or context_window(config.model_dir)))

    # -- plumbing --------------------------------------------------------------------------------

    def _http(self):
        import aiohttp

        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            # Many rollouts share a replica: allow many concurrent connections per host.
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=1024, limit_per_host=512))
        return self._session

    async def _request(self, method: str, url: str, body: Any = None, *, ok_404: bool = False) -> Any:
        """One HTTP call; any failure becomes an EngineError that names the URL. Returns parsed JSON."""
        import aiohttp

        try:
            async with self._http().request(method, url, json=body) as resp:
                text = await resp.text()
                if resp.status == 404 and ok_404:
                    return None
                if resp.status >= 400:
                    raise EngineError(f"{url} answered {resp.status}: {text[:300]}")
                if not text.strip():
                    return {}
                try:
                    return json.loads(text)
                except ValueError:
                    raise EngineError(f"{url} answered with something that is not JSON: {text[:200]!r}") from None
        except aiohttp.ClientError as e:
            raise ReplicaUnreachable(f"cannot reach {url}: {type(e).__name__}: {e}") from e
        except asyncio.TimeoutError:
            raise ReplicaUnreachable(f"{url} did not answer within {self.timeout_s:.0f}s") from None

    async def _detect(self) -> None:
        """Settle the server kind and vLLM's model name once, from the first replica that answers."""
        if self._detect_lock is None:
            self._detect_lock = asyncio.Lock()
        async with self._detect_lock:
            if self.server != "auto" and (self.server != "vllm" or self.served_model):
                return
            errors = []
            for rep in self.replicas:
                try:
                    if self.server in ("auto", "sglang") and await self._request("GET", f"{rep.url}/get_model_info", ok_404=True) is not None:
                        self.server = "sglang"
                        return
                    models = await self._request("GET", f"{rep.url}/v1/models")
                    data = models.get("data") if isinstance(models, dict) else None
                    if not data:
                        raise EngineError(f"{rep.url}/v1/models lists no model")
                    self.server = "vllm"
                    self.served_model = self.served_model or data[0]["id"]
                    if data[0].get("max_model_len"):
                        self.max_context = min(self.max_context, int(data[0]["max_model_len"]))
                    return
                except EngineError as e:
                    errors.append(str(e))
            raise EngineError("no remote server answered: " + "; ".join(errors))

    def _route(self, rollout_id: str) -> list[Replica]:
        """Replicas to try, sticky first; those marked down go last (tried only if all are down)."""
        if rollout_id:
            order = [self.replicas[i] for i in rank_replicas(rollout_id, self.urls)]
        else:  # no rollout to stick to: spread round-robin
            self._rr += 1
            order = self.replicas[self._rr % len(self.replicas):] + self.replicas[: self._rr % len(self.replicas)]
        now = time.monotonic()
        return [r for r in order if r.down_until <= now] + [r for r in order if r.down_until > now]

    # -- the Engine protocol ---------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], sampling: Sampling, rollout_id: str = "") -> Generation:
        if not prompt_ids:
            raise EngineError("empty prompt")
        if sampling.max_tokens <= 0:  # servers reject a zero budget; the contract says "length"
            return Generation([], [], "length", self.policy_version)
        await self._detect()
        async with self._gate.generation():  # a reload in progress: start on the new weights, not mid-swap
            version = self.policy_version
            last: EngineError | None = None
            for rep in self._route(rollout_id):
                try:
                    gen = await (self._vllm(rep, prompt_ids, sampling) if self.server == "vllm"
                                 else self._sglang(rep, prompt_ids, sampling))
                except ReplicaUnreachable as e:  # an answered error is raised as is: another replica would say the same
                    rep.down_until = time.monotonic() + self.retry_after_s
                    last = e
                    continue
                rep.down_until = 0.0
                gen.policy_version = version
                return gen
            raise last or EngineError("no replica to send the request to")

    async def _vllm(self, rep: Replica, prompt_ids: list[int], s: Sampling) -> Generation:
        body = {
            "model": self.served_model, "prompt": list(prompt_ids), "max_tokens": s.max_tokens,
            # every sampling field explicit: the server would otherwise fill gaps from generation_config.json
            "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k if s.top_k > 0 else 0,
            "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "min_tokens": 0,
            "stop_token_ids": list(s.stop_token_ids), "logprobs": 0, "return_token_ids": True,
            "return_tokens_as_token_ids": True, "skip_special_tokens": False, "stream": False,
        }
        if s.seed is not None:
            body["seed"] = int(s.seed)
        out = await self._request("POST", f"{rep.url}/v1/completions", body)
        try:
            choice = out["choices"][0]
            lp = choice["logprobs"]
            ids = choice.get("token_ids")
            if ids is None:  # older servers: ids only as "token_id:N" strings
                ids = [int(t.split(":", 1)[1]) for t in lp["tokens"]]
            logprobs = [float(x) if x is not None else 0.0 for x in lp["token_logprobs"]]
            finish = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise EngineError(f"{rep.url}/v1/completions answered in an unexpected shape ({type(e).__name__}: {e})") from None
        return _generation(list(map(int, ids)), logprobs, finish, rep.url)

    async def _sglang(self, rep: Replica, prompt_ids: list[int], s: Sampling) -> Generation:
        params: dict[str, Any] = {
            "max_new_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else -1, "stop_token_ids": list(s.stop_token_ids),
            "skip_special_tokens": False, "no_stop_trim": True,  # keep the end-of-turn id in the output
        }
        if s.seed is not None:
            params["sampling_seed"] = int(s.seed)
        body = {"input_ids": list(prompt_ids), "sampling_params": params, "return_logprob": True, "stream": False}
        out = await self._request("POST", f"{rep.url}/generate", body)
        try:
            meta = out["meta_info"]
            pairs = meta["output_token_logprobs"]  # [[logprob, token_id, text-or-null], ...]
            ids = [int(p[1]) for p in pairs]
            logprobs = [float(p[0]) if p[0] is not None else 0.0 for p in pairs]
            fr = meta.get("finish_reason")
            finish = fr.get("type") if isinstance(fr, dict) else fr
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise EngineError(f"{rep.url}/generate answered in an unexpected shape ({type(e).__name__}: {e})") from None
        return _generation(ids, logprobs, finish, rep.url)

    async def reload(self, checkpoint_dir: Path) -> int:
        ckpt = Path(checkpoint_dir).resolve()
        if not (ckpt / "config.json").exists():
            raise UserError(f"{ckpt} is not a model directory (no config.json)")
        await self._detect()
        await self._gate.hold()
        try:
            await asyncio.gather(*(self._reload_one(rep, ckpt) for rep in self.replicas))
            self.policy_version += 1
            return self.policy_version
        finally:
            await self._gate.release()

    async def _reload_one(self, rep: Replica, ckpt: Path) -> None:
        """One replica loads `ckpt`; any failure is a UserError (the admin route answers 400 with it)."""
        try:
            if self.server == "sglang":
                out = await self._request("POST", f"{rep.url}/update_weights_from_disk",
                                          {"model_path": str(ckpt), "weight_version": str(self.policy_version + 1)})
                if isinstance(out, dict) and out.get("success") is False:
                    raise UserError(f"{rep.url} refused the reload from {ckpt}: {out.get('message')}")
                return
            rpc = await self._request("POST", f"{rep.url}/collective_rpc",
                                      {"method": "reload_weights", "kwargs": {"weights_path": str(ckpt)}}, ok_404=True)
            if rpc is None:
                raise UserError(f"vLLM server {rep.url} has no weight-reload route: start it with VLLM_SERVER_DEV_MODE=1 "
                                f"(enables /collective_rpc), or restart it on {ckpt}")
            # cached prefixes hold keys/values computed by the old weights
            await self._request("POST", f"{rep.url}/reset_prefix_cache")
        except EngineError as e:
            raise UserError(f"reload of {ckpt} on {rep.url} failed: {e}") from None

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()


def _generation(ids: list[int], logprobs: list[float], finish: Any, url: str) -> Generation:
    if len(ids) != len(logprobs):
        raise EngineError(f"{url} returned {len(ids)} token ids but {len(logprobs)} logprobs")
    if finish == "abort" or finish not in ("stop", "length"):
        raise EngineError(f"{url} ended the generation with finish reason {finish!r}")
    return Generation(ids, logprobs, finish, 0)
