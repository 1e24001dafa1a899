"""The remote engine against fake vLLM and SGLang servers on 127.0.0.1 (small aiohttp apps that
answer in each server's wire format): request bodies, response parsing, rollout-sticky routing,
failover, reload through the weight-update routes, and every failure surfacing as EngineError."""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from clawgym.engines import ENGINES, EngineConfig, EngineError, Sampling, make_engine
from clawgym.engines.remote import RemoteEngine, parse_urls, rank_replicas
from clawgym.errors import UserError

S = Sampling(max_tokens=4, temperature=1.0, stop_token_ids=(2,))


@dataclass
class FakeServer:
    """A fake vLLM (`kind="vllm"`) or SGLang (`kind="sglang"`) server: canned answers, recorded requests."""

    kind: str = "vllm"
    dev_routes: bool = True
    """vLLM: serve /collective_rpc and /reset_prefix_cache (VLLM_SERVER_DEV_MODE=1)"""
    answer: dict | None = None
    """replace the canned generation answer (malformed shapes, errors)"""
    status: int = 200
    hold: asyncio.Event | None = None
    """when set: generation answers wait for this event"""
    requests: list[tuple[str, Any]] = field(default_factory=list)
    url: str = ""

    def _gen(self, n: int, start: int) -> tuple[list[int], list[float]]:
        ids = [start + i for i in range(n - 1)] + [2]  # ends with the stop id
        return ids, [-0.5 - 0.1 * i for i in range(n)]

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        path = request.path
        self.requests.append((path, body))
        if path in ("/v1/completions", "/generate") and self.hold is not None:
            await self.hold.wait()
        if self.status != 200:
            return web.json_response({"error": "boom"}, status=self.status)
        if self.kind == "sglang":
            if path == "/get_model_info":
                return web.json_response({"model_path": "/m", "is_generation": True})
            if path == "/generate":
                if self.answer is not None:
                    return web.json_response(self.answer)
                ids, lps = self._gen(3, 100 + len(body["input_ids"]))
                return web.json_response({"text": "x", "output_ids": ids, "meta_info": {
                    "finish_reason": {"type": "stop", "matched": 2},
                    "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)]}})
            if path == "/update_weights_from_disk":
                ok = Path(body["model_path"]).name != "refused"
                return web.json_response({"success": ok, "message": "ok" if ok else "bad checkpoint"},
                                         status=200 if ok else 400)
        else:
            if path == "/v1/models":
                return web.json_response({"data": [{"id": "tiny", "max_model_len": 4096}]})
            if path == "/v1/completions":
                if self.answer is not None:
                    return web.json_response(self.answer)
                ids, lps = self._gen(4, 200 + len(body["prompt"]))
                return web.json_response({"choices": [{"index": 0, "text": "", "finish_reason": "stop", "token_ids": ids,
                                                       "logprobs": {"tokens": [f"token_id:{t}" for t in ids],
                                                                    "token_logprobs": lps}}]})
            if path in ("/collective_rpc", "/reset_prefix_cache") and self.dev_routes:
                return web.json_response({"results": [None]} if path == "/collective_rpc" else {"success": True})
        return web.json_response({"detail": "Not Found"}, status=404)

    async def __aenter__(self) -> "FakeServer":
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._runner.cleanup()

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]


def engine(model: Path, *servers: FakeServer, **options: Any) -> RemoteEngine:
    return make_engine("remote", EngineConfig(model, {"engine_url": ",".join(s.url for s in servers), **options}))


def test_registered_and_url_parsing(tiny_model):
    assert {"remote", "vllm"} <= set(ENGINES)
    assert parse_urls(" http://a:1/v1/ ,https://b:2") == ["http://a:1", "https://b:2"]
    with pytest.raises(UserError, match="http://"):
        parse_urls("a:8000")
    with pytest.raises(UserError, match="--engine-url"):
        make_engine("remote", EngineConfig(tiny_model, {}))
    with pytest.raises(UserError, match="unknown remote engine option.*dtype"):
        make_engine("remote", EngineConfig(tiny_model, {"engine_url": "http://x:1", "dtype": "float32"}))
    with pytest.raises(UserError, match="server kind 'tgi'"):
        make_engine("remote", EngineConfig(tiny_model, {"engine_url": "http://x:1", "server": "tgi"}))


def test_rendezvous_ranking_is_sticky_spread_and_minimal_on_removal():
    urls = ["http://a:1", "http://b:1", "http://c:1"]
    firsts = collections.Counter(urls[rank_replicas(f"r{i}", urls)[0]] for i in range(300))
    assert all(firsts[u] >= 60 for u in urls), firsts  # every replica takes a fair share of rollouts
    assert all(rank_replicas(f"r{i}", urls) == rank_replicas(f"r{i}", list(urls)) for i in range(50))
    # dropping replica c moves only c's rollouts: the others keep their replica (and its prefix cache)
    for i in range(300):
        top = urls[rank_replicas(f"r{i}", urls)[0]]
        if top != "http://c:1":
            assert urls[:2][rank_replicas(f"r{i}", urls[:2])[0]] == top


def test_vllm_dialect_request_and_response(tiny_model):
    async def go():
        async with FakeServer("vllm") as srv:
            eng = engine(tiny_model, srv)
            gen = await eng.generate([5, 6, 7], Sampling(max_tokens=4, temperature=0.7, top_k=5, seed=3, stop_token_ids=(2, 9)), "r1")
            await eng.close()
            return eng, srv, gen

    eng, srv, gen = asyncio.run(go())
    assert eng.server == "vllm" and eng.served_model == "tiny" and eng.max_context == 4096
    assert gen.output_ids == [203, 204, 205, 2] and gen.finish_reason == "stop" and gen.policy_version == 0
    assert gen.output_logprobs == pytest.approx([-0.5, -0.6, -0.7, -0.8])
    body = dict(srv.requests)["/v1/completions"]
    assert body["prompt"] == [5, 6, 7] and body["model"] == "tiny" and body["logprobs"] == 0
    assert body["return_token_ids"] is True and body["skip_special_tokens"] is False
    assert (body["temperature"], body["top_k"], body["seed"], body["stop_token_ids"]) == (0.7, 5, 3, [2, 9])


def test_sglang_dialect_request_and_response(tiny_model):
    async def go():
        async with FakeServer("sglang") as srv:
            eng = engine(tiny_model, srv)
            gen = await eng.generate([5, 6], S, "r1")
            await eng.close()
            return eng, srv, gen

    eng, srv, gen = asyncio.run(go())
    assert eng.server == "sglang"
    assert gen.output_ids == [102, 103, 2] and gen.output_logprobs == pytest.approx([-0.5, -0.6, -0.7]) and gen.finish_reason == "stop"
    body = dict(srv.requests)["/generate"]
    assert body["input_ids"] == [5, 6] and body["return_logprob"] is True
    assert body["sampling_params"]["max_new_tokens"] == 4 and body["sampling_params"]["top_k"] == -1
    assert body["sampling_params"]["no_stop_trim"] is True


def test_rollouts_stick_to_one_replica_and_fail_over(tiny_model):
    async def go():
        async with FakeServer() as a, FakeServer() as b:
            eng = engine(tiny_model, a, b, server="vllm", served_model="tiny")
            for turn in range(3):
                await asyncio.gather(*(eng.generate([1] * (turn + 2), S, f"roll-{i}") for i in range(12)))
            seen = {name: [tuple(body["prompt"]) for p, body in srv.requests if p == "/v1/completions"] for name, srv in (("a", a), ("b", b))}
            await b.__aexit__()  # replica b goes away: its rollouts move to a, the rest stay
            moved = await asyncio.gather(*(eng.generate([9], S, f"roll-{i}") for i in range(12)))
            await eng.close()
            return eng, a, seen, moved

    eng, a, seen, moved = asyncio.run(go())
    assert seen["a"] and seen["b"]  # both replicas used
    home = {f"roll-{i}": eng.urls[rank_replicas(f"roll-{i}", eng.urls)[0]] for i in range(12)}
    assert sum(1 for u in home.values() if u == a.url) * 3 == len(seen["a"])  # every call of a rollout hit its home
    assert len(moved) == 12 and all(g.output_ids for g in moved)
    assert [r for r in eng.replicas if r.url != a.url][0].down_until > 0


def test_failures_are_engine_errors(tiny_model):
    bad_answers = [
        ({"choices": []}, "unexpected shape"),
        ({"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "stop"}]}, "2 token ids but 1 logprobs"),
        ({"choices": [{"token_ids": [1], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "abort"}]}, "finish reason 'abort'"),
    ]

    async def go():
        out = []
        for answer, match in bad_answers:
            async with FakeServer(answer=answer) as srv:
                eng = engine(tiny_model, srv)
                with pytest.raises(EngineError, match=match):
                    await eng.generate([1], S, "r")
                await eng.close()
        async with FakeServer(status=500) as srv:
            eng = engine(tiny_model, srv, server="vllm", served_model="tiny")
            with pytest.raises(EngineError, match="answered 500"):
                await eng.generate([1], S, "r")
            await eng.close()
            out.append(len(srv.requests))  # an answered error is not retried elsewhere
        eng = engine(tiny_model, FakeServer(url="http://127.0.0.1:9"))  # nothing listens on port 9
        with pytest.raises(EngineError, match="no remote server answered"):
            await eng.generate([1], S, "r")
        await eng.close()
        eng = engine(tiny_model, FakeServer(url="http://127.0.0.1:9"), server="sglang")
        with pytest.raises(EngineError, match="cannot reach"):
            await eng.generate([1], S, "r")
        with pytest.raises(EngineError, match="empty prompt"):
            await eng.generate([], S, "r")
        await eng.close()
        return out

    assert asyncio.run(go()) == [1]


def test_reload_routes_and_version(tiny_model, tmp_path):
    async def go():
        async with FakeServer("vllm") as v, FakeServer("vllm", dev_routes=False) as nodev, FakeServer("sglang") as sg:
            eng = engine(tiny_model, v)
            assert await eng.reload(tiny_model) == 1
            gen = await eng.generate([1], S, "r")
            plain = engine(tiny_model, nodev)
            with pytest.raises(UserError, match="VLLM_SERVER_DEV_MODE=1"):
                await plain.reload(tiny_model)
            await plain.close()
            sgl = engine(tiny_model, sg)
            assert await sgl.reload(tiny_model) == 1
            refused = tmp_path / "refused"
            refused.mkdir()
            (refused / "config.json").write_text("{}")
            with pytest.raises(UserError, match="reload of .*refused on .* failed: .*answered 400.*bad checkpoint"):
                await sgl.reload(refused)
            with pytest.raises(UserError, match="no config.json"):
                await sgl.reload(tmp_path)
            await eng.close()
            await sgl.close()
            return v, sg, gen

    v, sg, gen = asyncio.run(go())
    assert gen.policy_version == 1
    rpc = [b for p, b in v.requests if p == "/collective_rpc"][0]
    assert rpc == {"method": "reload_weights", "kwargs": {"weights_path": str(Path(tiny_model).resolve())}}
    assert v.paths().index("/reset_prefix_cache") > v.paths().index("/collective_rpc")
    assert [b for p, b in sg.requests if p == "/update_weights_from_disk"][0]["model_path"] == str(Path(tiny_model).resolve())


def test_reload_waits_for_running_generations(tiny_model):
    """A completion is sampled by exactly one policy version: reload starts after it returns."""
    async def go():
        hold = asyncio.Event()
        async with FakeServer("vllm", hold=hold) as srv:
            eng = engine(tiny_model, srv, server="vllm", served_model="tiny")
            gen = asyncio.create_task(eng.generate([1, 2], S, "r"))
            while "/v1/completions" not in srv.paths():
                await asyncio.sleep(0.01)
            reload = asyncio.create_task(eng.reload(tiny_model))
            await asyncio.sleep(0.1)
            reload_started_early = "/collective_rpc" in srv.paths()
            hold.set()
            g, version = await gen, await reload
            await eng.close()
            return g, version, reload_started_early

    g, version, early = asyncio.run(go())
    assert not early and g.policy_version == 0 and version == 1


def test_vllm_engine_without_vllm_names_the_install_script(tiny_model):
    pytest.importorskip("aiohttp")
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm is installed in this environment")
    with pytest.raises(UserError, match="install-vllm-cpu.sh"):
        make_engine("vllm", EngineConfig(tiny_model, {}))


def test_vllm_options_are_checked():
    from clawgym.engines.vllm import VLLMOptions

    assert VLLMOptions.parse({"dtype": "float32", "max_context": 10}).dtype == "float32"
    with pytest.raises(UserError, match="unknown vllm engine option.*gpu_mem"):
        VLLMOptions.parse({"gpu_mem": 0.5})


@pytest.mark.slow
def test_serve_proxy_engine_flags_are_checked(tiny_model):
    import os
    import subprocess
    import sys

    def serve(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "clawgym.cli", "serve-proxy", "--model", str(tiny_model), "--port", "0", *args],
                              capture_output=True, text=True, timeout=120, env=dict(os.environ, HF_HUB_OFFLINE="1"))

    out = serve("--engine", "remote", "--engine-option", "server")
    assert out.returncode == 1 and "--engine-option expects KEY=VALUE" in out.stderr
    out = serve("--engine", "remote")
    assert out.returncode == 1 and "needs --engine-url" in out.stderr
    out = serve("--engine", "remote", "--engine-url", "http://127.0.0.1:9", "--engine-option", "server=tgi")
    assert out.returncode == 1 and "unknown remote server kind 'tgi'" in out.stderr
