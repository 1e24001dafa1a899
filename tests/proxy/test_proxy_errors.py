"""Bad input and failures: each answered in the protocol's own error shape and status, refused calls
never recorded, engine failures recorded as failed attempts, keys never written anywhere."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request

import anthropic
import openai
import orjson
import pytest

from clawgym.proxy import ProxyConfig, ProxyThread, read_records
from clawgym.proxy.client import ProxyUnavailable

WINDOW = 400


PROXY = {"max_body_bytes": 50_000, "max_context": WINDOW, "ping_interval_s": 0.02}
"""the module's proxy (conftest `proxy`): a small body limit and window"""


def post(url: str, body: bytes, headers: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, orjson.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, orjson.loads(e.read())


ROUTES = {  # protocol -> (path, auth header maker, a valid body)
    "anthropic": ("/v1/messages", lambda k: {"x-api-key": k},
                  {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}),
    "chat": ("/v1/chat/completions", lambda k: {"Authorization": f"Bearer {k}"},
             {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/v1/responses", lambda k: {"Authorization": f"Bearer {k}"}, {"model": "m", "input": "hi"}),
}


def assert_shape(proto: str, status: int, body: dict, want_status: int, etype: str | None = None, code: str | None = None):
    assert status == want_status, body
    if proto == "anthropic":
        assert body["type"] == "error" and isinstance(body["error"]["message"], str) and body["error"]["message"]
        if etype:
            assert body["error"]["type"] == etype
    else:
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        assert set(body["error"]) == {"message", "type", "param", "code"}
        if code:
            assert body["error"]["code"] == code


@pytest.mark.parametrize("proto", list(ROUTES))
def test_refused_requests_are_never_recorded(proxy, proto):
    path, auth, good = ROUTES[proto]
    reg = proxy.register(f"bad-{proto}")
    url = f"{proxy.url}/r/{reg['rollout_id']}{path}"
    key = reg["api_key"]
    # malformed JSON
    s, b = post(url, b"{not json", auth(key))
    assert_shape(proto, s, b, 400, "invalid_request_error")
    assert "not valid JSON" in (b["error"]["message"])
    # a required field missing, named in the message
    missing = {"anthropic": "max_tokens", "chat": "messages", "responses": "input"}[proto]
    s, b = post(url, orjson.dumps({k: v for k, v in good.items() if k != missing}), auth(key))
    assert_shape(proto, s, b, 400, "invalid_request_error")
    assert missing in b["error"]["message"]
    # wrong types inside messages
    s, b = post(url, orjson.dumps(good | ({"messages": [{"role": "wizard", "content": "x"}]} if proto != "responses"
                                           else {"input": [{"type": "message", "role": "wizard", "content": "x"}]})), auth(key))
    assert_shape(proto, s, b, 400)
    assert "wizard" in b["error"]["message"]
    # unknown rollout
    s, b = post(f"{proxy.url}/r/nobody{path}", orjson.dumps(good), auth(key))
    assert_shape(proto, s, b, 404, "not_found_error")
    # wrong key, and no key at all
    s, b = post(url, orjson.dumps(good), auth("sk-wrong"))
    assert_shape(proto, s, b, 401, "authentication_error", "invalid_api_key")
    s, b = post(url, orjson.dumps(good), {})
    assert_shape(proto, s, b, 401)
    # another rollout's key does not work here
    other = proxy.register(f"bad-{proto}-other")
    s, b = post(url, orjson.dumps(good), auth(other["api_key"]))
    assert s == 401
    # oversized body
    big = good | {"metadata": {"pad": "x" * 60_000}}
    s, b = post(url, orjson.dumps(big), auth(key))
    assert_shape(proto, s, b, 413, "request_too_large", "request_too_large")
    # a prompt longer than the window: the wording harnesses react to by compacting
    long = "word " * 2000
    body = good | ({"messages": [{"role": "user", "content": long}]} if proto != "responses" else {"input": long})
    s, b = post(url, orjson.dumps(body), auth(key))
    if proto == "anthropic":
        assert_shape(proto, s, b, 400, "invalid_request_error")
        assert b["error"]["message"].startswith("prompt is too long:")
    else:
        assert_shape(proto, s, b, 400, code="context_length_exceeded")
    st = proxy.settle(reg["rollout_id"])
    assert st["calls_recorded"] == 0 and st["calls_started"] == 0
    assert not (proxy.config.records_dir / f"{reg['rollout_id']}.jsonl").exists()


def test_sdk_errors_map_to_sdk_exception_types(proxy):
    reg = proxy.register("sdk-errors")
    a = anthropic.Anthropic(base_url=reg["base_url"], api_key="sk-nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        a.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    a = anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        a.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "word " * 2000}])
    o = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        o.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 2000}])
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="previous_response_id is not supported"):
        o.responses.create(model="m", input="hi", previous_response_id="resp_1")
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=f"{proxy.url}/r/ghost/v1", api_key="k", max_retries=0).models.list()
    assert [m.id for m in o.models.list()] == [proxy.server.model_name]


def test_engine_failure_is_overloaded_and_recorded(proxy):
    fail = {"error": "engine exploded"}
    reg = proxy.register("engine-fails", script=[fail, fail, fail, fail, fail])
    a = anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0)
    kw = dict(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.OverloadedError, match="engine exploded") as e:
        a.messages.create(**kw)
    assert e.value.status_code == 529 and e.value.body["error"]["type"] == "overloaded_error"
    with pytest.raises(anthropic.APIStatusError, match="engine exploded"):  # mid-stream: an error event
        with a.messages.stream(**kw) as s:
            s.get_final_message()
    o = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    with pytest.raises(openai.InternalServerError) as e2:
        o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert e2.value.status_code == 503 and e2.value.code == "overloaded"
    with pytest.raises(openai.APIError, match="engine exploded"):
        list(o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
    events = list(o.responses.create(model="m", input="hi", stream=True))
    assert events[-1].type == "response.failed" and "engine exploded" in events[-1].response.error.message
    proxy.settle("engine-fails")
    recs = read_records(proxy.config.records_dir / "engine-fails.jsonl")
    assert [r.status for r in recs] == ["engine_error"] * 5
    assert all(r.error == "engine exploded" and r.output_ids == [] and r.finish_reason == "error" for r in recs)
    assert [r.stream for r in recs] == [False, True, False, True, True]
    st = proxy.admin("GET", "/admin/rollouts/engine-fails")
    assert st["errors"] == 5 and (st["last_call_status"], st["last_call_error"]) == ("engine_error", "engine exploded")


def test_status_names_the_last_answered_call_so_remote_runners_need_no_records(proxy):
    """A Ray worker on another node reads whether the engine failed last from the status route."""
    reg = proxy.register("recovers", script=[{"error": "engine down"}, "fine"])
    o = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    assert proxy.admin("GET", "/admin/rollouts/recovers")["last_call_status"] == ""  # nothing answered yet
    with pytest.raises(openai.InternalServerError):
        o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert proxy.settle("recovers")["last_call_status"] == "engine_error"
    o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    st = proxy.settle("recovers")
    assert (st["last_call_status"], st["last_call_error"]) == ("ok", "")


def read_sse(url: str, body: dict, headers: dict) -> list[tuple[str | None, dict | str]]:
    req = urllib.request.Request(url, data=orjson.dumps(body), method="POST", headers={"Content-Type": "application/json", **headers})
    out, event = [], None
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                out.append((event, orjson.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]"))
                event = None
            elif line.startswith(":"):
                out.append((None, "comment"))
    return out


def test_pseudo_streaming_opens_at_once_and_pings_while_generating(proxy):
    reg = proxy.register("pings", script=[{"text": "slow answer", "delay_s": 0.3}, {"text": "slow", "delay_s": 0.3}])
    events = read_sse(f"{reg['base_url']}/v1/messages?beta=true",
                      {"model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
                      {"x-api-key": reg["api_key"], "anthropic-version": "2023-06-01"})
    names = [e for e, _ in events]
    assert names[0] == "message_start" and all(e is not None for e in names)  # every event has an event: line
    first_block = names.index("content_block_start")
    assert names[1:first_block].count("ping") >= 3  # pings came while the engine worked, before the content
    assert names[first_block:] == ["content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert all(d["type"] == e for e, d in events)
    chat = read_sse(f"{reg['openai_base_url']}/chat/completions",
                    {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
                    {"Authorization": f"Bearer {reg['api_key']}"})
    assert chat[0][1]["choices"][0]["delta"]["role"] == "assistant"
    assert [d for _, d in chat[1:4]] == ["comment"] * 3
    assert chat[-1][1] == "[DONE]" and chat[-2][1]["choices"][0]["finish_reason"] == "stop"


def test_admin_routes_need_the_admin_token_and_keys_stay_secret(proxy, caplog):
    caplog.set_level(logging.DEBUG)
    req = urllib.request.Request(f"{proxy.url}/admin/health")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 401
    req = urllib.request.Request(f"{proxy.url}/admin/rollouts", data=b"{}", method="POST",
                                 headers={"Authorization": "Bearer wrong"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 401
    health = proxy.admin("GET", "/admin/health")
    assert health["status"] == "ok" and health["engine"] == "scripted" and health["max_context"] == WINDOW
    reg = proxy.register("secret-keeper", script=["fine"])
    with pytest.raises(ProxyUnavailable) as e:
        proxy.register("secret-keeper")
    assert e.value.status == 409
    with pytest.raises(ProxyUnavailable) as e:
        proxy.register("../etc/passwd")
    assert e.value.status == 400 and "invalid rollout id" in e.value.reason
    with pytest.raises(ProxyUnavailable) as e:
        proxy.admin("GET", "/admin/rollouts/ghost")
    assert e.value.status == 404
    o = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    assert o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices[0].message.content == "fine"
    st = proxy.settle("secret-keeper")
    assert st["calls_recorded"] == 1 and st["in_flight"] == 0 and st["last_activity"] > 0
    metrics = urllib.request.urlopen(urllib.request.Request(
        f"{proxy.url}/admin/metrics", headers={"Authorization": f"Bearer {proxy.server.admin_token}"}), timeout=10).read().decode()
    assert 'clawgym_proxy_calls_total{protocol="openai-chat",status="ok"}' in metrics
    assert "clawgym_proxy_render_total" in metrics and "clawgym_proxy_in_flight 0" in metrics
    reload = proxy.admin("POST", "/admin/reload", {"checkpoint": str(proxy.config.model_dir)})
    assert reload["policy_version"] == 1
    closed = proxy.admin("DELETE", "/admin/rollouts/secret-keeper")
    assert closed["closed"] and "secret-keeper" not in proxy.server.rollouts
    # no API key in any record file or log line
    keys = [r.api_key for r in proxy.server.rollouts.values()] + [reg["api_key"]]
    blob = b"".join(p.read_bytes() for p in proxy.config.records_dir.glob("*.jsonl"))
    assert blob and not any(k.encode() in blob for k in keys)
    assert not any(k in caplog.text for k in keys)


def test_shared_api_key_registers_rollouts_on_first_use(tiny_model, tmp_path):
    config = ProxyConfig(model_dir=tiny_model, engine="scripted", port=0, records_dir=tmp_path, api_key="sk-shared")
    with ProxyThread(config) as p:
        p.server.engine.push("*", ["hello"])
        o = openai.OpenAI(base_url=f"{p.url}/r/adhoc-1/v1", api_key="sk-shared", max_retries=0)
        assert o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices[0].message.content == "hello"
        with pytest.raises(openai.NotFoundError):
            openai.OpenAI(base_url=f"{p.url}/r/adhoc-2/v1", api_key="sk-other", max_retries=0).models.list()
        assert p.settle("adhoc-1")["calls_recorded"] == 1


@pytest.mark.slow
def test_cli_serves_and_refuses_bad_arguments(tiny_model, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    cli = [sys.executable, "-c", "from clawgym.cli import main; main()", "serve-proxy"]
    bad = subprocess.run(cli + ["--model", str(tmp_path / "none")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "not a model directory" in bad.stderr and "Traceback" not in bad.stderr
    script = tmp_path / "s.jsonl"
    script.write_text('{"rollout_id": "cli", "text": "from the cli"}\n')
    proc = subprocess.Popen(cli + ["--model", str(tiny_model), "--engine", "scripted", "--script", str(script), "--port", "0",
                                   "--records", str(tmp_path / "rec"), "--admin-token", "adm"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ | {"CLAWGYM_ADMIN_TOKEN": ""})
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving "), (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split(" on ")[1].split(";")[0]
        req = urllib.request.Request(f"{url}/admin/rollouts", data=b'{"rollout_id": "cli"}', method="POST",
                                     headers={"Authorization": "Bearer adm"})
        reg = orjson.loads(urllib.request.urlopen(req, timeout=30).read())
        a = anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0)
        assert a.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": "hi"}]).content[0].text == "from the cli"
    finally:
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(30)
    assert proc.returncode == 130 and (tmp_path / "rec" / "cli.jsonl").exists()
    # It handles SIGINT itself, even when started with SIGINT ignored (a background job), and
    # SIGTERM (kill, a container stopping) the same way: calls recorded, one line, the shell's
    # status for the signal (130, 143).
    for sig, preexec in ((signal.SIGINT, lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)), (signal.SIGTERM, None)):
        proc = subprocess.Popen(cli + ["--model", str(tiny_model), "--engine", "scripted", "--port", "0", "--records",
                                       str(tmp_path / f"rec-{sig}"), "--admin-token", "adm"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec)
        try:
            assert proc.stdout.readline().startswith("serving ")
            os.kill(proc.pid, sig)
            assert proc.wait(30) == (143 if sig == signal.SIGTERM else 130), sig
            assert proc.stderr.read().strip().splitlines()[-1] == ("terminated (SIGTERM)" if sig == signal.SIGTERM
                                                                   else "interrupted (SIGINT)")
        finally:
            proc.kill()


def test_client_that_goes_away_mid_stream_is_recorded_as_cancelled(proxy):
    import socket
    import time

    reg = proxy.register("walks-away", script=[{"text": "too late", "delay_s": 0.4}])
    host, port = proxy.url.removeprefix("http://").split(":")
    body = orjson.dumps({"model": "m", "max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"POST /r/walks-away/v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {reg['api_key']}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        assert b"message_start" in s.recv(65536) or b"message_start" in s.recv(65536)
    time.sleep(0.6)
    proxy.settle("walks-away")
    (rec,) = read_records(proxy.config.records_dir / "walks-away.jsonl")
    assert rec.status == "cancelled" and rec.output_ids == [] and ("went away" in rec.error or "before the engine" in rec.error)


def test_recorder_keeps_file_descriptors_bounded(tmp_path, monkeypatch):
    import asyncio

    from clawgym.artifacts import CallRecord
    from clawgym.proxy import recorder as rec_mod

    monkeypatch.setattr(rec_mod, "MAX_OPEN_FILES", 3)
    rec = rec_mod.Recorder(tmp_path)

    async def go():
        for i in range(10):
            for rid in ("a", "b", "c", "d", "e"):
                await rec.record(CallRecord(rid, f"c{i}", i, "direct", "m", 0.0, 0.0, [1, 2], [3], [0.0], "stop", 0))

    asyncio.run(go())
    assert len(rec._writers) <= 3
    rec.close()
    for rid in "abcde":
        recs = read_records(tmp_path / f"{rid}.jsonl")
        assert [r.seq for r in recs] == list(range(10))  # reopened files kept appending, in order
