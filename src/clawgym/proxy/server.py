"""The serving proxy: an aiohttp app that answers harnesses with the policy and records every call.

Routes (each rollout has its own base URL and API key, docs/architecture.md):

    POST /r/{rollout}/v1/messages              Anthropic Messages (also ?beta=true)
    POST /r/{rollout}/v1/messages/count_tokens
    POST /r/{rollout}/v1/chat/completions      OpenAI Chat Completions
    POST /r/{rollout}/v1/responses             OpenAI Responses (store:false, no server state)
    GET  /r/{rollout}/v1/models
    /admin/...                                 see `admin.py` (admin token)

A model call: find the rollout (404) → check its key (401, nothing recorded) → read the body
(413) → parse (400; an `x-clawgym-max-tokens` header caps the new tokens) → render with TITO
(`render.py`) → refuse a prompt longer than the window (400, the protocol's "prompt too long") →
generate → parse the turn once → answer (JSON, or SSE with the opening event at once and pings
while the engine works) → record (fsync) → no longer in flight. Engine failures answer
"overloaded" (529 / 503, or an error event mid-stream) and are recorded as failed attempts.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2
import orjson
from aiohttp import web

from clawgym.artifacts import CallRecord
from clawgym.engines.base import Chat, Engine, EngineConfig, EngineError, Generation, ReadsChat, Sampling
from clawgym.engines.registry import make_engine
from clawgym.models.templates import check_tool_template, load_chat_template
from clawgym.proxy import anthropic, openai_chat, openai_responses, toolparse
from clawgym.proxy.admin import Metrics, add_admin_routes, secret_matches
from clawgym.proxy.config import ProxyConfig
from clawgym.proxy.conversation import ConversationLog
from clawgym.proxy.recorder import ROLLOUT_ID, Recorder, check_rollout_id
from clawgym.proxy.render import Renderer, RolloutTito
from clawgym.proxy.types import MAX_TOKENS_HEADER, ChatRequest, ProtocolError, Turn, new_id

log = logging.getLogger("clawgym.proxy")


@dataclass
class Rollout:
    id: str
    api_key: str
    tito: RolloutTito
    role: str = "main"
    seq: int = 0
    in_flight: int = 0
    errors: int = 0
    last_activity: float = field(default_factory=time.time)
    last_call: tuple[int, str, str] = (-1, "", "")
    """(seq, status, error) of the latest-started call that finished without being cancelled"""
    conversation: ConversationLog = field(default_factory=ConversationLog)
    """what each call said and answered, for the rollout's transcript"""
    context_refused: tuple[int, str] = (-1, "")
    """(calls started by then, message) of the latest request refused as longer than the context window"""
    max_calls: int = 0
    """the most model calls the rollout may make (0: no bound); the call after them is refused"""
    budget_refused: str = ""
    """the message of the refusal once a call past `max_calls` was asked for"""


class ProxyServer:
    def __init__(self, config: ProxyConfig, engine: Engine | None = None):
        from transformers import AutoTokenizer

        self.config = config
        toolparse.check_name(config.tool_parser)  # before any loading: a typo fails at once
        self.tokenizer = AutoTokenizer.from_pretrained(config.model_dir)
        if config.chat_template:
            self.tokenizer.chat_template = load_chat_template(config.chat_template)
        # A template that drops tools, calls or results would make every tool task unsolvable unseen.
        check_tool_template(self.tokenizer, f"--chat-template {config.chat_template}" if config.chat_template
                            else f"--model {config.model_dir}")
        self.renderer = Renderer(self.tokenizer)
        self.tool_parser, self.tool_parser_source = toolparse.choose(config.tool_parser, self.renderer.text)
        self.parser = toolparse.PARSERS[self.tool_parser]
        opts = dict(config.engine_options)
        if config.max_context:
            opts.setdefault("max_context", config.max_context)
        if engine is None:
            engine = make_engine(config.engine, EngineConfig(Path(config.model_dir), opts, config.chat_template))
            engine.policy_version = config.policy_version
        self.engine = engine
        self.recorder = Recorder(config.records_dir)
        self.admin_token = config.admin_token or secrets.token_urlsafe(24)
        self.rollouts: dict[str, Rollout] = {}
        self.metrics = Metrics()
        self.model_name = Path(config.model_dir).name
        self._tasks: set[asyncio.Task] = set()
        self._runner: web.AppRunner | None = None
        self.port = config.port

    # -- rollouts ------------------------------------------------------------------------------

    def register(self, rollout_id: str | None = None, role: str = "main", api_key: str | None = None,
                 max_calls: int = 0) -> Rollout:
        rid = check_rollout_id(rollout_id or new_id("r"))
        if rid in self.rollouts:
            raise ProtocolError("conflict", f"rollout '{rid}' is already registered")
        r = Rollout(rid, api_key or "sk-cg-" + secrets.token_urlsafe(24), RolloutTito(self.renderer, self.config.audit_render), role,
                    max_calls=max_calls)
        self.rollouts[rid] = r
        return r

    def _rollout(self, request: web.Request) -> Rollout:
        rid = request.match_info["rollout"]
        r = self.rollouts.get(rid)
        key = _request_key(request)
        if r is None and self.config.api_key and secret_matches(key, self.config.api_key) and ROLLOUT_ID.match(rid):
            return self.register(rid, api_key=self.config.api_key)
        if r is None:
            raise ProtocolError("not_found", f"unknown rollout '{rid}': register it with the admin API first")
        if not secret_matches(key, r.api_key):
            raise ProtocolError("authentication", "invalid API key for this rollout (send it as x-api-key or Authorization: Bearer)")
        return r

    # -- app -----------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        r = app.router

        def route(proto: ModuleType):
            async def handler(request: web.Request) -> web.StreamResponse:
                return await self._model_call(request, proto)
            return handler

        r.add_post("/r/{rollout}/v1/messages", route(anthropic))
        r.add_post("/r/{rollout}/v1/messages/count_tokens", self._count_tokens)
        r.add_post("/r/{rollout}/v1/chat/completions", route(openai_chat))
        r.add_post("/r/{rollout}/v1/responses", route(openai_responses))
        r.add_get("/r/{rollout}/v1/models", self._models)
        add_admin_routes(app, self)
        return app

    async def start(self) -> str:
        # A client that goes away (a harness killed on timeout) cancels its handler, and with it the
        # generation it waits for: the call is recorded as cancelled at once and the rollout settles.
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # the real port when 0 was asked
        return f"http://{self.config.host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()  # stop accepting; running handlers finish (and spawn records)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)  # every record on disk
        await self.engine.close()
        self.recorder.close()

    # -- handlers ------------------------------------------------------------------------------

    async def _read_json(self, request: web.Request) -> Any:
        if request.content_length is not None and request.content_length > self.config.max_body_bytes:
            raise ProtocolError("too_large", f"request body of {request.content_length} bytes exceeds the "
                                             f"{self.config.max_body_bytes}-byte limit")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ProtocolError("too_large", f"request body exceeds the {self.config.max_body_bytes}-byte limit") from None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise ProtocolError("invalid_request", f"request body is not valid JSON: {e}") from None

    def _error(self, proto: ModuleType, e: ProtocolError, refused: bool = True) -> web.Response:
        status, body = proto.error(e.kind, e.message, e.param)
        if refused:
            self.metrics.inc("clawgym_proxy_refused_total", protocol=proto.PROTOCOL, kind=e.kind)
        return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")

    async def _models(self, request: web.Request) -> web.Response:
        proto = anthropic if "anthropic-version" in request.headers else openai_chat
        try:
            self._rollout(request)
        except ProtocolError as e:
            return self._error(proto, e)
        if proto is anthropic:
            body = {"data": [{"type": "model", "id": self.model_name, "display_name": self.model_name,
                              "created_at": "1970-01-01T00:00:00Z"}], "has_more": False,
                    "first_id": self.model_name, "last_id": self.model_name}
        else:
            body = {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "clawgym"}]}
        return web.json_response(body)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        try:
            rollout = self._rollout(request)
            req = anthropic.parse(await self._read_json(request), count_only=True)
        except ProtocolError as e:
            return self._error(anthropic, e)
        return web.json_response(anthropic.count_tokens_response(rollout.tito.count(req.messages, req.tools)))

    async def _model_call(self, request: web.Request, proto: ModuleType) -> web.StreamResponse:
        started = time.time()
        try:
            rollout = self._rollout(request)
            if rollout.max_calls and rollout.seq >= rollout.max_calls:
                # the harness ends on a 400 as on its endpoint's own refusal; the runner scores the rollout as it stands
                rollout.budget_refused = (f"this rollout's budget of {rollout.max_calls} model call"
                                          f"{'s' if rollout.max_calls > 1 else ''} is spent")
                raise ProtocolError("call_budget", rollout.budget_refused)
            req: ChatRequest = proto.parse(await self._read_json(request))
            cap = _max_tokens_header(request)
            try:
                plan = rollout.tito.render(req.messages, req.tools)
            except jinja2.TemplateError as e:  # e.g. a template that insists on alternating roles
                raise ProtocolError("invalid_request", f"the model's chat template rejected the conversation: {e}") from None
            window = self.engine.max_context
            if len(plan.prompt_ids) >= window:
                raise proto.context_error(len(plan.prompt_ids), window)
        except ProtocolError as e:
            if e.kind == "context_length":  # the runner reports it when no call came after (docs/harnesses.md)
                rollout.context_refused = (rollout.seq, e.message)
            return self._error(proto, e)
        self.metrics.inc("clawgym_proxy_render_total", mode=plan.mode)
        if plan.fallback:
            self.metrics.inc("clawgym_proxy_render_fallback_total")
        if plan.audit_mismatch:
            self.metrics.inc("clawgym_proxy_render_audit_mismatch_total")
        self.metrics.inc("clawgym_proxy_tito_spliced_turns_total", plan.spliced)
        self.metrics.inc("clawgym_proxy_tito_unmatched_turns_total", plan.unmatched)
        call_id, seq = new_id("call-"), rollout.seq
        rollout.seq += 1
        rollout.in_flight += 1
        rollout.last_activity = started
        rollout.tito.commit(plan, call_id)
        rollout.conversation.add_request(call_id, seq, req)
        self.metrics.gauge_add("clawgym_proxy_in_flight", 1)
        n_prompt = len(plan.prompt_ids)
        max_new = min(req.max_tokens or self.config.default_max_tokens, cap or window, window - n_prompt)
        sampling = Sampling(max_tokens=max_new, temperature=1.0 if req.temperature is None else req.temperature,
                            top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k or 0, seed=req.seed,
                            stop_token_ids=self.renderer.stop_ids)
        call = _Call(rollout, req, proto, call_id, seq, started, plan, sampling)
        try:
            if req.stream:
                return await self._stream(request, call)
            return await self._json(call)
        finally:
            self._spawn(self._finish(call))

    async def _generate(self, call: "_Call") -> Turn:
        if isinstance(self.engine, ReadsChat):  # an engine that answers from the conversation (the task teacher)
            chat = Chat([m.template_dict() for m in call.req.messages], [t.template_dict() for t in call.req.tools])
            gen: Generation = await self.engine.generate_chat(call.plan.prompt_ids, chat, call.sampling, call.rollout.id)
        else:
            gen = await self.engine.generate(call.plan.prompt_ids, call.sampling, call.rollout.id)
        ids = list(gen.output_ids)
        while ids and ids[-1] in self.renderer.stop_ids:
            ids.pop()
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        hit = _stop_cut(self.tokenizer, ids, text, call.req.stop) if call.req.stop else None
        if hit is not None:  # engines sample to the end of turn; stop strings are applied here, once
            keep, text, stop = hit
            gen = Generation(gen.output_ids[:keep], gen.output_logprobs[:keep], "stop", gen.policy_version)
        call.gen = gen
        parsed = self.parser.parse(text)
        finish = "tool_calls" if parsed.tool_calls and gen.finish_reason == "stop" else gen.finish_reason
        turn = Turn(parsed.text, parsed.tool_calls, parsed.reasoning, finish, len(call.plan.prompt_ids), len(gen.output_ids),
                    stop_sequence=hit[2] if hit else None)  # the record takes its ids and logprobs from call.gen
        call.proto.assign_ids(turn)
        # Before the harness can see the answer: its next request must find these sampled ids.
        call.rollout.tito.add_completion(call.call_id, turn.text, turn.tool_calls, gen.output_ids)
        call.rollout.conversation.add_output(call.call_id, turn)
        call.turn = turn
        return turn

    async def _json(self, call: "_Call") -> web.Response:
        try:
            turn = await self._generate(call)
        except Exception as e:
            call.fail(e)
            return self._error(call.proto, ProtocolError(call.error_kind, call.error), refused=False)
        body = call.proto.response(turn, call.req, call.resp_id)
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _stream(self, request: web.Request, call: "_Call") -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        stream = call.proto.Stream(call.req, call.resp_id, len(call.plan.prompt_ids))
        task = None
        try:
            await resp.prepare(request)
            await resp.write(stream.start())
            task = asyncio.ensure_future(self._generate(call))
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.config.ping_interval_s)
                if done:
                    break
                await resp.write(stream.ping())
            try:
                turn = task.result()
            except Exception as e:
                call.fail(e)
                await resp.write(stream.error(call.error_kind, call.error))
            else:
                await resp.write(stream.finish(turn))
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError) as e:
            if task is not None:
                task.cancel()  # nobody will read the answer: free the engine
            if call.status == "ok":
                call.status, call.error = "cancelled", f"client went away ({type(e).__name__})"
            if isinstance(e, asyncio.CancelledError):
                raise
        return resp

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish(self, call: "_Call") -> None:
        """Record the call (fsync'd), then it stops counting as in flight."""
        r, plan, gen = call.rollout, call.plan, call.gen
        if gen is None and call.status == "ok":
            call.status, call.error = "cancelled", "the request ended before the engine answered"
        rec = CallRecord(
            rollout_id=r.id, call_id=call.call_id, seq=call.seq, protocol=call.proto.PROTOCOL, model=call.req.model,
            started_at=call.started, finished_at=time.time(), prompt_ids=plan.delta.tail(plan.prompt_ids),
            output_ids=list(gen.output_ids) if gen else [], output_logprobs=list(gen.output_logprobs) if gen else [],
            finish_reason=call.turn.finish_reason if call.turn else ("error" if gen is None else gen.finish_reason),
            policy_version=gen.policy_version if gen else self.engine.policy_version,
            prompt_base_call=plan.delta.base_call, prompt_base_len=plan.delta.base_len, role=r.role,
            status=call.status, error=call.error, stream=call.req.stream, tool_names=[t.qualified_name for t in call.req.tools],
            system_hash=call.req.system_hash(), sampling_json=call.req.sampling_json(), render_mode=plan.mode,
            normalized_json=orjson.dumps(call.req.normalized).decode() if call.req.normalized else "{}",
        )
        try:
            await self.recorder.record(rec)
        except Exception:
            log.exception("could not write the record of call %s (rollout %s)", call.call_id, r.id)
        finally:
            r.in_flight -= 1
            r.last_activity = time.time()
            if call.status != "ok":
                r.errors += 1
            if call.status != "cancelled" and call.seq > r.last_call[0]:
                r.last_call = (call.seq, call.status, call.error)
            self.metrics.gauge_add("clawgym_proxy_in_flight", -1)
            self.metrics.inc("clawgym_proxy_calls_total", protocol=call.proto.PROTOCOL, status=call.status)
            self.metrics.inc("clawgym_proxy_prompt_tokens_total", len(plan.prompt_ids))
            self.metrics.inc("clawgym_proxy_output_tokens_total", len(rec.output_ids))
            self.metrics.observe("clawgym_proxy_call_seconds", rec.finished_at - rec.started_at)


@dataclass
class _Call:
    rollout: Rollout
    req: ChatRequest
    proto: ModuleType
    call_id: str
    seq: int
    started: float
    plan: Any
    sampling: Sampling
    resp_id: str = field(default_factory=lambda: new_id("msg_"))
    gen: Generation | None = None
    turn: Turn | None = None
    status: str = "ok"
    error: str = ""
    error_kind: str = "overloaded"

    def fail(self, e: Exception) -> None:
        self.status = "engine_error"
        self.error = str(e) or type(e).__name__
        if not isinstance(e, EngineError):
            log.exception("engine crashed on call %s", self.call_id, exc_info=e)
            self.error_kind, self.error = "internal", f"engine crashed: {type(e).__name__}: {e}"


def _stop_cut(tokenizer: Any, ids: list[int], text: str, stops: list[str]) -> tuple[int, str, str] | None:
    """Where the first stop string ends the turn: (ids to keep, text before it, the stop string).

    The kept ids are the shortest prefix whose text contains the stop string (as vLLM keeps the
    token that completed it), so the record holds exactly the tokens the harness was answered with.
    """
    found = [(text.find(s), s) for s in stops if s and s in text]
    if not found:
        return None
    pos, stop = min(found)
    lo, hi = 1, len(ids)
    while lo < hi:  # decoded length grows with the prefix: binary search the first prefix past the stop
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=False)) >= pos + len(stop):
            hi = mid
        else:
            lo = mid + 1
    return lo, text[:pos], stop


def _max_tokens_header(request: web.Request) -> int | None:
    value = request.headers.get(MAX_TOKENS_HEADER)
    if value is None:
        return None
    if not value.strip().isdigit() or int(value) < 1:
        raise ProtocolError("invalid_request", f"header {MAX_TOKENS_HEADER} must be an integer >= 1, got {value!r}")
    return int(value)


def _request_key(request: web.Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else None
