"""Security: what a hostile or buggy client, task or harness can and cannot do (issue 9, item 4).

- every proxy route, fuzzed with hypothesis (random JSON, valid bodies with one field replaced by
  anything, raw bytes, odd headers, malformed HTTP): never a 500 for a client mistake, no
  unhandled exception in the server, and the proxy keeps serving;
- one rollout's key cannot read or write another rollout's records, nor use the admin routes;
- task loading and importing reject paths leaving the task folder (`../`, absolute, symlinks);
- a harness in the local sandbox cannot write outside its sandbox (bubblewrap, where it works);
- API keys and the admin token never appear in records, logs or artifacts.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import textwrap
import urllib.parse
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawgym.errors import UserError
from clawgym.proxy import ProxyConfig, ProxyThread, read_records
from clawgym.proxy.client import ProxyUnavailable

# --------------------------------------------------------------------------------------------
# The proxy under fuzzing
# --------------------------------------------------------------------------------------------

WINDOW = 2048
N_SHARED = 5000  # shared scripted answers: valid fuzzed calls get a model answer, not "script exhausted"


def proxy_settings(folder: Path) -> dict:
    """The module's proxy (conftest `proxy`): small limits, and shared scripted answers for every rollout."""
    script = folder / "script.jsonl"
    script.write_text("".join(json.dumps({"rollout_id": "*", "text": "ok"}) + "\n" for _ in range(N_SHARED)))
    return {"max_body_bytes": 200_000, "max_context": WINDOW, "ping_interval_s": 0.05, "default_max_tokens": 16,
            "engine_options": {"script": str(script)}}


class _ServerErrors(logging.Handler):
    """Collects unhandled-exception reports: aiohttp logs them on 'aiohttp.server' and answers 500."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def server_errors():
    h = _ServerErrors()
    loggers = [logging.getLogger(n) for n in ("aiohttp.server", "aiohttp.web", "clawgym.proxy", "asyncio")]
    for lg in loggers:
        lg.addHandler(h)
    yield h.records
    for lg in loggers:
        lg.removeHandler(h)


def request(proxy, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    """One HTTP request on a fresh connection; returns (status, body). Never raises on 4xx/5xx."""
    host, port = "127.0.0.1", proxy.server.port
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
    max_leaves=20,
)

def _dumps(value) -> bytes:
    return json.dumps(value).encode()  # json, not orjson: orjson refuses ints past 64 bits


VALID = {  # route -> a valid body
    "/v1/messages": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages/count_tokens": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/chat/completions": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"model": "m", "max_output_tokens": 8, "input": "hi"},
}
# Field names each protocol reads: the mutation strategy replaces or adds one of them.
FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "max_output_tokens", "system", "tools", "tool_choice",
          "stream", "stream_options", "temperature", "top_p", "top_k", "seed", "stop", "stop_sequences", "n", "input",
          "instructions", "thinking", "metadata", "reasoning", "text", "store", "parallel_tool_calls", "include"]
MESSAGE_PARTS = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "function", "wizard"]) | JSON,
    "content": JSON | st.lists(st.fixed_dictionaries({"type": st.sampled_from(
        ["text", "image", "tool_use", "tool_result", "input_text", "output_text", "thinking", "function_call",
         "function_call_output", "message"]) | JSON}, optional={"text": JSON, "id": JSON, "name": JSON, "input": JSON,
                                                               "content": JSON, "tool_use_id": JSON, "call_id": JSON,
                                                               "arguments": JSON, "output": JSON}), max_size=3),
    "tool_calls": JSON | st.lists(st.fixed_dictionaries({"id": JSON, "type": JSON, "function": JSON | st.fixed_dictionaries(
        {"name": JSON, "arguments": JSON})}), max_size=2),
    "tool_call_id": JSON, "name": JSON, "type": JSON,
})
TOOLS = st.lists(st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["function", "custom", "namespace", "web_search"]) | JSON, "name": JSON,
    "description": JSON, "input_schema": JSON, "parameters": JSON, "function": JSON | st.fixed_dictionaries(
        {"name": JSON, "parameters": JSON, "description": JSON}), "tools": JSON}), max_size=3)


@st.composite
def bodies(draw, route: str) -> bytes:
    """Raw bytes, arbitrary JSON, or a valid body with fields replaced by hostile values."""
    kind = draw(st.sampled_from(["bytes", "json", "mutate", "mutate", "mutate", "huge"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "json":
        return _dumps(draw(JSON))
    body = dict(VALID[route])
    if kind == "huge":
        field = draw(st.sampled_from(["max_tokens", "max_output_tokens", "temperature", "top_k", "seed", "top_p"]))
        body[field] = draw(st.sampled_from([2**63, -(2**63), 10**30, 1e308, -1e308, 0, -1, 5e-324, 2**31]))
        return json.dumps(body).encode()  # json, not orjson: orjson refuses ints past 64 bits
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(FIELDS))
        body[field] = draw(st.one_of(JSON, st.lists(MESSAGE_PARTS, max_size=3), TOOLS))
    if draw(st.booleans()):
        body["stream"] = True
    return json.dumps(body).encode()


def check_answer(status: int, raw: bytes) -> None:
    """A client mistake is a 4xx; an engine failure a 503/529 'overloaded'; nothing ever a bare 500."""
    assert status != 500, raw[:500]
    assert status < 500 or status in (503, 529), (status, raw[:500])
    if status in (503, 529):
        assert b"overloaded" in raw or b"overloaded_error" in raw, raw[:500]


def keep_serving(proxy, rid: str, key: str) -> None:
    s, raw = request(proxy, "POST", f"/r/{rid}/v1/chat/completions", orjson.dumps(VALID["/v1/chat/completions"]),
                     {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    assert s == 200, raw[:300]
    s, _ = request(proxy, "GET", "/admin/health", headers={"Authorization": f"Bearer {proxy.server.admin_token}"})
    assert s == 200


FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])


@pytest.mark.parametrize("route", list(VALID))
def test_model_routes_fuzzed(proxy, server_errors, route):
    reg = proxy.register(f"fuzz{route.replace('/', '-')}")
    rid, key = reg["rollout_id"], reg["api_key"]
    auth = {"x-api-key": key} if "messages" in route else {"Authorization": f"Bearer {key}"}

    @FUZZ
    @given(body=bodies(route), ctype=st.sampled_from(["application/json", "text/plain", "", "application/json; charset=latin-1",
                                                        "multipart/form-data; boundary=x"]),
           extra=st.dictionaries(st.sampled_from(["anthropic-version", "anthropic-beta", "OpenAI-Beta", "Accept",
                                                  "Accept-Encoding", "x-stainless-retry-count", "Idempotency-Key"]),
                                 st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=30), max_size=3))
    def one(body, ctype, extra):
        headers = {**extra, **auth, "Content-Type": ctype} if ctype else {**extra, **auth}
        status, raw = request(proxy, "POST", f"/r/{rid}{route}", body, headers)
        check_answer(status, raw)

    one()
    assert server_errors == [], [r.getMessage() for r in server_errors][:3]
    keep_serving(proxy, rid, key)
    proxy.settle(rid)
    # Every answered model call is recorded, and the file reads back whole.
    recs = read_records(proxy.server.recorder.path(rid)) if proxy.server.recorder.path(rid).exists() else []
    assert len(recs) == proxy.server.recorder.count(rid)


def test_models_route_and_auth_headers_fuzzed(proxy, server_errors):
    """GET /v1/models, and every route with hostile credentials: only the rollout's own key opens it."""
    reg = proxy.register("fuzz-auth")
    key = reg["api_key"]
    # printable ASCII and bytes 0x80-0xff (http.client sends str headers as latin-1): values that are not UTF-8
    printable = st.text(st.characters(min_codepoint=0x21, max_codepoint=0xff, exclude_characters="\x7f"), max_size=300)

    @FUZZ
    @given(route=st.sampled_from(["/v1/models", *VALID]),
           auth=st.one_of(printable.map(lambda t: {"Authorization": t}), printable.map(lambda t: {"Authorization": "Bearer " + t}),
                          printable.map(lambda t: {"x-api-key": t}), st.just({"Authorization": "Bearer " + key[:-1]}),
                          st.just({"Authorization": "Basic " + key}), st.just({"x-api-key": key + " "}),
                          st.just({"Authorization": "Bearer " + key}), st.just({"x-api-key": key}), st.just({})),
           anthropic=st.booleans())
    def one(route, auth, anthropic):
        headers = {**auth, **({"anthropic-version": "2023-06-01"} if anthropic else {}), "Content-Type": "application/json"}
        method, body = ("GET", None) if route == "/v1/models" else ("POST", _dumps(VALID[route]))
        status, raw = request(proxy, method, f"/r/fuzz-auth{route}", body, headers)
        check_answer(status, raw)
        # HTTP drops whitespace around a header value: "KEY " is KEY
        opened = auth.get("x-api-key", "").strip() == key or auth.get("Authorization", "").lower().startswith("bearer ") \
            and auth["Authorization"][7:].strip() == key
        if not opened:
            assert status == 401, (auth, status, raw[:200])

    proxy.server.engine.push("fuzz-auth", ["ok"] * 200)
    one()
    assert server_errors == [], [r.getMessage() for r in server_errors][:3]


def raw_request(proxy, head: bytes, body: bytes = b"") -> tuple[int, dict]:
    """Send exact bytes (http.client would re-encode a header); returns (status, JSON body)."""
    with socket.create_connection(("127.0.0.1", proxy.server.port), timeout=30) as s:
        s.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split(b" ")[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


@pytest.mark.parametrize("header", [b"x-api-key: \xff\xfe%s", b"Authorization: Bearer \xff\xfe%s",
                                    b"Authorization: Bearer %s\xc3", b"x-api-key: %s\x80"])
def test_key_header_that_is_not_utf8_gets_the_protocols_401(proxy, server_errors, header):
    """Bytes that are not UTF-8 in the key header (the rollout's key around them) are a wrong key on
    every API and on the admin routes: each answers its own 401 shape, never a 500."""
    reg = proxy.register(None)
    rid, key = reg["rollout_id"], reg["api_key"]
    cred = header % key.encode()
    for route, method, extra in [("/v1/messages", b"POST", b"anthropic-version: 2023-06-01\r\n"),
                                 ("/v1/messages/count_tokens", b"POST", b"anthropic-version: 2023-06-01\r\n"),
                                 ("/v1/chat/completions", b"POST", b""), ("/v1/responses", b"POST", b""),
                                 ("/v1/models", b"GET", b""), ("/v1/models", b"GET", b"anthropic-version: 2023-06-01\r\n")]:
        body = _dumps(VALID[route]) if method == b"POST" else b""
        head = b"%s /r/%s%s HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n%s%s\r\n" % (
            method, rid.encode(), route.encode(), extra, cred)
        status, answer = raw_request(proxy, head, body)
        assert status == 401, (route, status, answer)
        if b"anthropic-version" in extra:
            assert answer["type"] == "error" and answer["error"]["type"] == "authentication_error", answer
        else:
            assert answer["error"]["code"] == "invalid_api_key" and answer["error"]["type"] == "invalid_request_error", answer
    admin_cred = cred.replace(key.encode(), proxy.server.admin_token.encode()).replace(b"x-api-key", b"x-admin-token")
    for method, path in [(b"GET", b"/admin/health"), (b"GET", b"/admin/metrics"), (b"POST", b"/admin/rollouts")]:
        status, answer = raw_request(proxy, b"%s %s HTTP/1.1\r\nHost: a\r\n%s\r\n" % (method, path, admin_cred),
                                     b"{}" if method == b"POST" else b"")
        assert status == 401 and "admin token" in answer["error"]["message"], (path, status, answer)
    assert server_errors == [], [r.getMessage() for r in server_errors][:3]
    assert proxy.server.recorder.count(rid) == 0
    proxy.server.engine.push(rid, ["still serving"])
    keep_serving(proxy, rid, key)


ADMIN_ROUTES = [("POST", "/admin/rollouts"), ("GET", "/admin/rollouts/{id}"), ("DELETE", "/admin/rollouts/{id}"),
                ("POST", "/admin/rollouts/{id}/script"), ("POST", "/admin/reload"), ("GET", "/admin/health"),
                ("GET", "/admin/metrics"), ("GET", "/admin/rollouts/{id}/conversation"), ("DELETE", "/admin/engine/cache")]


@pytest.mark.parametrize("method,path", ADMIN_ROUTES)
def test_admin_routes_fuzzed(proxy, server_errors, tmp_path, method, path):
    token = proxy.server.admin_token
    target = f"fuzz-target-{ADMIN_ROUTES.index((method, path))}"
    admin_fields = st.fixed_dictionaries({}, optional={"rollout_id": JSON | st.text(max_size=140), "role": JSON,
                                                       "script": JSON | st.lists(JSON, max_size=3), "items": JSON | st.lists(
                                                           JSON | st.fixed_dictionaries({}, optional={"text": JSON, "error": JSON,
                                                                                                       "delay_s": JSON}), max_size=3),
                                                       "checkpoint": JSON | st.just(str(tmp_path)) | st.just("/nonexistent")})

    @FUZZ
    @given(body=st.one_of(st.binary(max_size=100), JSON.map(_dumps), admin_fields.map(_dumps)),
           rid=st.text(max_size=40) | st.just(target),
           auth=st.sampled_from(["ok", "none", "wrong", "bearer-empty", "x-admin"]))
    def one(body, rid, auth):
        headers = {"Content-Type": "application/json"}
        if auth == "ok":
            headers["Authorization"] = f"Bearer {token}"
        elif auth == "wrong":
            headers["Authorization"] = f"Bearer {token}x"
        elif auth == "bearer-empty":
            headers["Authorization"] = "Bearer "
        elif auth == "x-admin":
            headers["x-admin-token"] = token
        url = path.replace("{id}", urllib.parse.quote(rid, safe="") or "x")
        status, raw = request(proxy, method, url, body if method == "POST" else None, headers)
        assert status < 500, (status, raw[:300])
        if auth not in ("ok", "x-admin"):
            # 401 before anything is looked up; a path no route matches is the router's bare 404
            assert status == 401 or (status == 404 and raw == b"404: Not Found"), (status, raw[:300])

    proxy.register(target)
    one()
    assert server_errors == [], [r.getMessage() for r in server_errors][:3]
    reg = proxy.register(None)
    proxy.server.engine.push(reg["rollout_id"], ["still serving"])
    keep_serving(proxy, reg["rollout_id"], reg["api_key"])


MALFORMED = [
    b"POST /r/x/v1/messages HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\n",
    b"POST /r/x/v1/messages HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n{}",
    b"POST /r/x/v1/messages HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nnot hex\r\n0\r\n\r\n",
    b"POST /r/x/v1/messages HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /admin/health HTTP/1.1\r\nHost: a\r\nX-Big: " + b"b" * 20000 + b"\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(40)),  # a TLS hello on the plain port
    b"GARBAGE\r\n\r\n",
    b"POST /r/%2e%2e%2f%2e%2e%2fetc%2fpasswd/v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /r/../../x/v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}",
]


@pytest.mark.parametrize("raw", MALFORMED, ids=[f"malformed{i}" for i in range(len(MALFORMED))])
def test_malformed_http_is_refused_without_a_500(proxy, server_errors, raw):
    with socket.create_connection(("127.0.0.1", proxy.server.port), timeout=10) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    if answer:  # a client that speaks no HTTP may just be hung up on
        status = int(answer.split(b" ", 2)[1])
        assert 400 <= status < 500, answer[:300]
    # aiohttp logs a request it cannot parse at ERROR (and answers 400): that is not a server fault.
    from aiohttp.http_exceptions import HttpProcessingError

    faults = [r for r in server_errors if not (r.exc_info and isinstance(r.exc_info[1], HttpProcessingError)
                                              and 400 <= r.exc_info[1].code < 500)]
    assert faults == [], [r.getMessage() for r in faults]
    reg = proxy.register(None)
    proxy.server.engine.push(reg["rollout_id"], ["x"])
    keep_serving(proxy, reg["rollout_id"], reg["api_key"])
    assert not any(p.name.startswith("..") or "/" in p.name for p in proxy.server.recorder.dir.iterdir())


def test_body_over_the_limit_is_413(proxy):
    reg = proxy.register(None)
    big = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 300_000}]})
    s, raw = request(proxy, "POST", f"/r/{reg['rollout_id']}/v1/chat/completions", big,
                     {"Authorization": f"Bearer {reg['api_key']}", "Content-Type": "application/json"})
    assert s == 413, raw[:200]
    # Deep nesting is a parse error, not a crash of the JSON parser or the renderer.
    deep = b"[" * 5000 + b"]" * 5000
    s, raw = request(proxy, "POST", f"/r/{reg['rollout_id']}/v1/chat/completions", deep,
                     {"Authorization": f"Bearer {reg['api_key']}", "Content-Type": "application/json"})
    assert s == 400, raw[:200]


# --------------------------------------------------------------------------------------------
# Isolation between rollouts
# --------------------------------------------------------------------------------------------


def test_a_rollouts_key_cannot_touch_another_rollout(proxy):
    a, b = proxy.register("iso-a", script=["a1", "a2"]), proxy.register("iso-b", script=["b1", "b2"])
    auth_a = {"Authorization": f"Bearer {a['api_key']}", "Content-Type": "application/json"}
    body = orjson.dumps(VALID["/v1/chat/completions"])
    assert request(proxy, "POST", "/r/iso-b/v1/chat/completions", body, {"Authorization": f"Bearer {b['api_key']}"})[0] == 200
    proxy.settle("iso-b")
    before = proxy.server.recorder.path("iso-b").read_bytes()

    # A's key on B's routes: refused, nothing recorded into B, B's script untouched.
    for route in VALID:
        s, raw = request(proxy, "POST", f"/r/iso-b{route}", orjson.dumps(VALID[route]), auth_a)
        assert s == 401, (route, s, raw[:200])
        s, _ = request(proxy, "POST", f"/r/iso-b{route}", orjson.dumps(VALID[route]), {"x-api-key": a["api_key"]})
        assert s == 401
    assert request(proxy, "GET", "/r/iso-b/v1/models", None, auth_a)[0] == 401
    # ... nor through the admin routes: a rollout key is not the admin token.
    for method, path, payload in [("GET", "/admin/rollouts/iso-b", None), ("DELETE", "/admin/rollouts/iso-b", None),
                                  ("POST", "/admin/rollouts/iso-b/script", b'{"items": ["evil"]}'),
                                  ("POST", "/admin/rollouts", b'{"rollout_id": "iso-b"}'), ("GET", "/admin/metrics", None),
                                  ("POST", "/admin/reload", b'{"checkpoint": "/tmp"}')]:
        for h in (auth_a, {"x-admin-token": a["api_key"]}, {"x-admin-token": b["api_key"]}):
            assert request(proxy, method, path, payload, h)[0] == 401, (method, path)
    assert proxy.server.recorder.path("iso-b").read_bytes() == before
    assert proxy.server.engine.remaining("iso-b") == 1 and proxy.server.engine.remaining("iso-a") == 2
    # Re-registering B (with the admin token) does not hand out a second key for it.
    with pytest.raises(ProxyUnavailable) as e:
        proxy.register("iso-b")
    assert e.value.status == 409
    # A rollout id that would be a path outside the records folder is refused at registration.
    for bad in ["../evil", "..", "/abs", "a/b", ".hidden", "x" * 200, "a\x00b"]:
        s, _ = request(proxy, "POST", "/admin/rollouts", orjson.dumps({"rollout_id": bad}),
                       {"Authorization": f"Bearer {proxy.server.admin_token}"})
        assert s == 400, bad
    assert not (proxy.server.recorder.dir.parent / "evil.jsonl").exists()


def test_shared_key_mode_cannot_reach_registered_rollouts(tiny_model, tmp_path):
    """With `--api-key` any unknown id registers on first use, but never takes over a registered rollout."""
    cfg = ProxyConfig(model_dir=tiny_model, engine="scripted", port=0, records_dir=tmp_path / "rec", api_key="sk-shared-123456",
                      max_context=WINDOW)
    with ProxyThread(cfg) as p:
        p.register("owned", script=["mine"])
        body = orjson.dumps(VALID["/v1/chat/completions"])
        shared = {"Authorization": "Bearer sk-shared-123456"}
        assert request(p, "POST", "/r/owned/v1/chat/completions", body, shared)[0] == 401
        assert p.server.engine.remaining("owned") == 1
        # an id that is not a safe file name is not auto-registered either
        assert request(p, "POST", "/r/..%2Fx/v1/chat/completions", body, shared)[0] == 404
        assert sorted(x.name for x in (tmp_path / "rec").iterdir()) == []


# --------------------------------------------------------------------------------------------
# Tasks: nothing outside the task folder is ever read or linked in
# --------------------------------------------------------------------------------------------


def _task(root: Path, name: str = "t") -> Path:
    d = root / name
    (d / "workspace").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "task.toml").write_text(f'[metadata]\nid = "{name}"\n')
    (d / "instruction.md").write_text("Do it.\n")
    (d / "tests" / "check.py").write_text("print('{}')\n")
    return d


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    f = tmp_path / "outside" / "secret.txt"
    f.parent.mkdir()
    f.write_text("TOP-SECRET-CONTENT\n")
    return f


@pytest.mark.parametrize("where", ["workspace/link", "tests/link", "workspace/sub/dirlink", "instruction.md", "task.toml",
                                   "tests/check.py"])
def test_load_task_rejects_symlinks_leaving_the_folder(tmp_path, secret, where):
    from clawgym.tasks import load_task

    d = _task(tmp_path / "tasks")
    link = d / where
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.exists():
        link.unlink()
    link.symlink_to(secret.parent if "dirlink" in where else secret)
    with pytest.raises(UserError) as e:
        load_task(d)
    assert "outside the task folder" in str(e.value)
    assert "TOP-SECRET" not in str(e.value)


def test_load_task_accepts_links_inside_and_rejects_dangling(tmp_path):
    from clawgym.tasks import load_task

    d = _task(tmp_path / "tasks")
    (d / "workspace" / "a.txt").write_text("a")
    (d / "workspace" / "b.txt").symlink_to("a.txt")
    assert load_task(d).id == "t"
    (d / "workspace" / "c.txt").symlink_to("missing.txt")
    with pytest.raises(UserError):
        load_task(d)


@pytest.mark.parametrize("value", ["../x.txt", "a/../../x.txt", "/etc/passwd", "~/x", "C:\\x", "..\\..\\x", "..", ""])
def test_relative_paths_in_task_files_cannot_leave(value):
    from clawgym.tasks.spec import safe_join, safe_relpath

    with pytest.raises(UserError):
        safe_relpath(value, "test")
    with pytest.raises(UserError):
        safe_join(Path("/base"), value, "test")


def test_rubric_file_paths_cannot_leave(tmp_path):
    from clawgym.tasks import load_task

    d = _task(tmp_path / "tasks")
    (d / "tests" / "rubric.md").write_text(textwrap.dedent("""\
        ## Reads the file
        Files: ../../etc/passwd
        The answer quotes it.
    """))
    with pytest.raises(UserError) as e:
        load_task(d)
    assert "leaves" in str(e.value) or "not allowed" in str(e.value)


@pytest.mark.parametrize("where", ["input_files/secret.txt", "input_files/dir", "reward/helper.py", "data_entry.json"])
def test_clawgym_import_rejects_symlinks_leaving_the_source(tmp_path, secret, where):
    """Before the fix, the importer copied links as the files they point to: the secret landed in the workspace."""
    from clawgym.tasks.importers import import_tasks

    src = tmp_path / "src" / "task1"
    (src / "input_files").mkdir(parents=True)
    (src / "reward").mkdir()
    (src / "reward" / "check.py").write_text("print('{}')\n")
    (src / "input_files" / "data.txt").write_text("fine\n")
    (src / "data_entry.json").write_text(json.dumps({"task_id": "task1", "user_query": "Summarize data.txt"}))
    link = src / where
    if link.exists():
        link.unlink()
    link.symlink_to(secret.parent if where.endswith("dir") else secret)
    dst = tmp_path / "dst"
    report = import_tasks("clawgym", src.parent, dst)
    assert report.imported == [] and len(report.skipped) == 1
    assert "outside" in report.skipped[0][1] and "TOP-SECRET" not in report.skipped[0][1]
    # However the importer reports it, the secret never lands in an imported task.
    leaked = [p for p in dst.rglob("*") if p.is_file() and b"TOP-SECRET" in p.read_bytes()] if dst.exists() else []
    assert leaked == []


def test_harbor_import_rejects_symlinks_leaving_the_source(tmp_path, secret):
    """Before the fix, the instruction was read through the link: the secret became the task's prompt."""
    from clawgym.tasks.importers import import_tasks

    src = tmp_path / "harbor" / "h1"
    (src / "tests").mkdir(parents=True)
    (src / "task.toml").write_text('version = "1.0"\n[environment]\nallow_internet = false\n')
    (src / "instruction.md").symlink_to(secret)
    (src / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    (src / "solution").mkdir()
    (src / "solution" / "solve.sh").symlink_to(secret)
    dst = tmp_path / "dst"
    report = import_tasks("harbor", src.parent, dst)
    assert report.imported == [] and "outside" in report.skipped[0][1]
    leaked = [p for p in dst.rglob("*") if p.is_file() and b"TOP-SECRET" in p.read_bytes()] if dst.exists() else []
    assert leaked == []


# --------------------------------------------------------------------------------------------
# The sandbox: nothing outside it is writable
# --------------------------------------------------------------------------------------------


def _bwrap_problem() -> str | None:
    from clawgym.rollout.sandbox_local import namespace_problem

    return namespace_problem("bwrap")


@pytest.mark.skipif(_bwrap_problem() is not None, reason=f"bubblewrap unavailable: {_bwrap_problem()}")
def test_bwrap_sandbox_cannot_write_outside_its_folder(tmp_path):
    from clawgym.rollout.sandbox import SandboxConfig
    from clawgym.rollout.sandbox_local import LocalSandbox

    outside = Path(os.environ.get("HOME", "/root")) / f".clawgym-sec-{os.getpid()}"  # not under /tmp: a real host path
    other = tmp_path / "other-sandbox-area"
    other.mkdir()
    targets = [outside, other / "x", Path("/var/tmp") / f"clawgym-sec-{os.getpid()}", Path("/dev/shm") / f"clawgym-sec-{os.getpid()}",
               Path("/usr/local/clawgym-sec"), Path("/etc/clawgym-sec")]
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "up").symlink_to(tmp_path)  # a seed link pointing out of the workspace does not open a way out
    cfg = SandboxConfig(base_dir=tmp_path / "sb", network="bwrap")
    try:
        with LocalSandbox(seed, cfg) as sb:
            script = "; ".join(f"echo pwned > {t} 2>/dev/null && echo WROTE {t}" for t in targets)
            script += "; echo pwned > up/escaped 2>/dev/null && echo WROTE up/escaped; echo ok > inside.txt; echo done"
            r = sb.run(["sh", "-c", script], timeout=30)
            out = r.stdout()
            assert "done" in out and (sb.workspace / "inside.txt").read_text() == "ok\n"
            # what bwrap lets through (/tmp, /dev/shm) are private mounts: nothing reaches the host
            leaked = [t for t in [*targets, tmp_path / "escaped"] if t.exists()]
            assert leaked == [], (leaked, out)
    finally:
        for t in targets:
            if t.exists() and t.is_file():
                t.unlink()


@pytest.mark.slow
@pytest.mark.skipif(_bwrap_problem() is not None, reason=f"bubblewrap unavailable: {_bwrap_problem()}")
def test_a_harness_tool_call_cannot_write_outside(tmp_path, tiny_model):
    """The real path: the model asks the agentloop harness to write outside; the rollout runs, the host is untouched."""
    from clawgym.rollout.runner import RolloutConfig, run_rollouts

    canary = Path(os.environ.get("HOME", "/root")) / f".clawgym-canary-{os.getpid()}"
    tasks = tmp_path / "tasks"
    _task(tasks, "esc")
    call = lambda name, **a: f"<tool_call>\n{json.dumps({'name': name, 'arguments': a})}\n</tool_call>"  # noqa: E731
    items = [call("bash", command=f"echo pwned > {canary}"), call("write", path=str(canary), content="pwned"),
             call("python", code=f"open({str(canary)!r}, 'w').write('pwned')"), "Done."]
    script = tmp_path / "s.jsonl"
    script.write_text("".join(json.dumps({"rollout_id": "esc.agentloop.0", "text": t}) + "\n" for t in items))
    cfg = RolloutConfig(tasks=tasks, harnesses=["agentloop"], out=tmp_path / "out", model=tiny_model, engine="scripted",
                        engine_options={"script": str(script)}, network="bwrap")
    try:
        summary = run_rollouts(cfg)
        assert [r.status for r in summary.rollouts] == ["ok"] and summary.n_calls == 4
        assert not canary.exists()
    finally:
        canary.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# Secrets never written
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_keys_never_appear_in_records_logs_or_artifacts(tiny_model, tmp_path, caplog):
    """Rollout keys and the admin token: not in records, calls/rollouts parquet, configs, results or logs."""
    from clawgym.proxy.server import ProxyServer
    from clawgym.rollout.runner import RolloutConfig, run_rollouts

    keys: list[str] = []
    original = ProxyServer.register

    def spy(self, *a, **kw):
        r = original(self, *a, **kw)
        keys.append(r.api_key)
        return r

    tasks = tmp_path / "tasks"
    _task(tasks, "k")
    records = tmp_path / "records"
    caplog.set_level(logging.DEBUG)
    ProxyServer.register = spy
    try:
        cfg_proxy = ProxyConfig(model_dir=tiny_model, engine="scripted", port=0, records_dir=records, max_context=WINDOW)
        with ProxyThread(cfg_proxy) as p:
            admin = p.server.admin_token
            items = {"k.agentloop.0": ["<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"env\"}}\n</tool_call>",
                                       "Done."],
                     "k.agentloop.1": [{"error": "boom"}] * 2 + ["Done."]}
            for rid, texts in items.items():
                p.server.engine.push(rid, texts)
            cfg = RolloutConfig(tasks=tasks, harnesses=["agentloop"], out=tmp_path / "out", group_size=2, concurrency=2,
                                proxy_url=p.url, admin_token=admin, records=records, engine="scripted")
            summary = run_rollouts(cfg)
            # The harness's own key can reach the model's input (an `env` tool call): it is dead by then,
            # since the runner closes each rollout; a closed rollout's key opens nothing.
            s_closed, _ = request(p, "POST", "/r/k.agentloop.0/v1/chat/completions", orjson.dumps(VALID["/v1/chat/completions"]),
                                  {"Authorization": f"Bearer {keys[0]}"})
            assert s_closed == 404
            # a refused call with a wrong key, and an admin call with a wrong token: logged nowhere with the key
            request(p, "POST", "/r/k.agentloop.0/v1/chat/completions", b"{}", {"Authorization": f"Bearer {keys[0]}-x"})
            request(p, "GET", "/admin/health", headers={"Authorization": f"Bearer {admin}-x"})
    finally:
        ProxyServer.register = original
    assert len(keys) == 2 and summary.n_calls >= 3
    # The `env` tool call put the harness's environment (with its key) into the next prompt: that
    # is the model's input, recorded as token ids. What must never be written is the key as text.
    secrets_ = [admin, *keys]
    texts = [caplog.text]
    for f in [*tmp_path.joinpath("out").rglob("*"), *records.rglob("*")]:
        if f.is_file():
            texts.append(f.read_bytes().decode("latin-1"))
    for s in secrets_:
        for t in texts:
            assert s not in t
    cfg_json = json.loads((tmp_path / "out" / "rollout.config.json").read_text())
    assert cfg_json["admin_token"] == "<redacted>"
