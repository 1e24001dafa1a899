"""Fault injection (issue 9, item 3): what survives a crash, a full disk, an engine storm, a killed trainer.

- the proxy (`clawgym serve-proxy`, a real process) SIGKILLed mid-rollout and restarted: every
  complete record intact, a torn line ignored, the rollouts it cut `infra_error` and excluded from
  training, and the restarted proxy appends cleanly to the same files;
- a sandbox folder deleted underneath a running rollout: `infra_error`, the others unaffected;
- the records disk full (a real 64 KiB tmpfs where mount works, else an injected ENOSPC): the
  write fails loudly, no half record stays in the file, the rollout is `infra_error`, and a Parquet
  export fails with a clear error leaving no partial file;
- a storm of engine errors: the harness retries, every failed attempt is recorded as
  `engine_error`, and build-trees keeps none of them;
- a trainer killed while it saves (inside the file writes, and between the two renames): the
  previous checkpoint still loads, with its weights.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from clawgym import artifacts as A
from clawgym.proxy import ProxyConfig, ProxyThread, read_records
from clawgym.rollout.runner import RolloutConfig, run_rollouts
from clawgym.trees import build_rollout_tree

from helpers import CHECK_HI, make_task, script, tool_call

SAY_HI = {"instruction": "Say hi.", "check": CHECK_HI}
"""the task the fault tests run (helpers.make_task)"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def admin(url: str, token: str, method: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(url + path, method=method, data=orjson.dumps(body) if body is not None else None,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return orjson.loads(r.read())


def start_proxy(model: Path, records: Path, port: int, token: str, script: Path | None, log: Path) -> subprocess.Popen:
    """`clawgym serve-proxy` as its own process; returns once it answers on /admin/health."""
    argv = [sys.executable, "-m", "clawgym.cli", "serve-proxy", "--model", str(model), "--engine", "scripted",
            "--port", str(port), "--records", str(records), "--admin-token", token, "--max-context", "4096"]
    if script is not None:
        argv += ["--script", str(script)]
    p = subprocess.Popen(argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"serve-proxy exited {p.returncode}: {log.read_text()[-2000:]}")
        try:
            admin(f"http://127.0.0.1:{port}", token, "GET", "/admin/health")
            return p
        except OSError:
            time.sleep(0.2)
    p.kill()
    raise RuntimeError("serve-proxy did not come up within 60 s")


# --------------------------------------------------------------------------------------------
# The proxy killed mid-rollout
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_proxy_sigkill_mid_rollout_then_restart(tmp_path: Path, tiny_model: Path) -> None:
    tasks, records, port, token = tmp_path / "tasks", tmp_path / "records", free_port(), "admin-secret-token-123"
    make_task(tasks, "kill", timeout=60, **SAY_HI)
    ids = [f"kill.agentloop.{i}" for i in range(3)]
    # Each rollout: one call answered at once, then a call the engine holds for a minute (killed meanwhile).
    s = script(tmp_path / "script.jsonl", {rid: [tool_call("bash", command=f"echo {rid} > f.txt"),
                                                 {"text": "Done.", "delay_s": 60}] for rid in ids})
    proxy = start_proxy(tiny_model, records, port, token, s, tmp_path / "proxy1.log")
    url = f"http://127.0.0.1:{port}"
    cfg = RolloutConfig(tasks=tasks, harnesses=["agentloop"], out=tmp_path / "out", group_size=3, concurrency=3, proxy_url=url,
                        admin_token=token, records=records, engine="scripted", settle_timeout_s=5)
    box: dict = {}
    runner = threading.Thread(target=lambda: box.setdefault("summary", run_rollouts(cfg)), daemon=True)
    try:
        runner.start()
        # Wait until each rollout has one record on disk and its second call in flight.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                st = [admin(url, token, "GET", f"/admin/rollouts/{rid}") for rid in ids]
            except OSError:
                st = []
            if st and all(s["calls_recorded"] == 1 and s["in_flight"] == 1 for s in st):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the rollouts never reached their second call")
        before = {rid: (records / f"{rid}.jsonl").read_bytes() for rid in ids}
        os.killpg(proxy.pid, signal.SIGKILL)
        proxy.wait(10)
        # What a kill in the middle of a write leaves: half a record, no newline.
        with open(records / f"{ids[0]}.jsonl", "ab") as f:
            f.write(b'{"rollout_id": "' + ids[0].encode() + b'", "call_id": "call-torn", "seq": 1, "prompt_ids": [1, 2,')
        runner.join(120)
        assert not runner.is_alive(), "the runner hung after the proxy died"
    finally:
        if proxy.poll() is None:
            os.killpg(proxy.pid, signal.SIGKILL)

    summary = box["summary"]
    assert sorted(r.rollout_id for r in summary.rollouts) == ids
    for r in summary.rollouts:
        assert r.status == "infra_error" and r.reward is None and not r.trainable, r
    # Every complete record is intact (byte for byte), the torn line is skipped by readers.
    for rid in ids:
        recs = read_records(records / f"{rid}.jsonl")
        assert len(recs) == 1 and recs[0].status == "ok" and recs[0].seq == 0
        assert (records / f"{rid}.jsonl").read_bytes().startswith(before[rid])
    torn = A.read_jsonl(records / f"{ids[0]}.jsonl").torn
    assert len(torn) == 1 and torn[0].is_last
    # The run's tables hold exactly those records; build-trees excludes the cut rollouts.
    calls = A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord)
    assert sorted(c.rollout_id for c in calls) == ids
    for r in summary.rollouts:
        tree = build_rollout_tree([c for c in calls if c.rollout_id == r.rollout_id], r)
        assert tree.stats.decision == "excluded_rollout" and not any(n.kept for n in tree.nodes)

    # Restarted on the same port and records: it serves, and appends after the torn line cleanly.
    proxy = start_proxy(tiny_model, records, port, token, None, tmp_path / "proxy2.log")
    try:
        reg = admin(url, token, "POST", "/admin/rollouts", {"rollout_id": ids[0], "script": ["again"]})
        body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        req = urllib.request.Request(f"{url}/r/{ids[0]}/v1/chat/completions", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {reg['api_key']}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert orjson.loads(r.read())["choices"][0]["message"]["content"] == "again"
        deadline = time.monotonic() + 10
        while admin(url, token, "GET", f"/admin/rollouts/{ids[0]}")["calls_recorded"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proxy.send_signal(signal.SIGINT)
        try:
            proxy.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proxy.pid, signal.SIGKILL)
    recs = read_records(records / f"{ids[0]}.jsonl")
    assert [r.status for r in recs] == ["ok", "ok"] and recs[0].call_id != recs[1].call_id
    assert len(A.read_jsonl(records / f"{ids[0]}.jsonl").torn) == 1  # still only the one torn line


# --------------------------------------------------------------------------------------------
# The records disk full
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _tmpfs(mnt: Path, size: str):
    """A tmpfs of `size` at `mnt` (needs mount rights, e.g. root); skips the test with the reason otherwise."""
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip()[:200]} (the injected-ENOSPC test covers this)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture
def small_fs(tmp_path: Path):
    """A 64 KiB tmpfs."""
    with _tmpfs(tmp_path / "small", "64k") as mnt:
        yield mnt


def _fill(path: Path) -> None:
    """Use up the filesystem, leaving about 1 KiB: enough for some bytes of a record, not a whole one."""
    with open(path / "ballast", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 1024)
        except OSError:
            pass
    size = (path / "ballast").stat().st_size
    os.truncate(path / "ballast", max(0, size - 1024))


def test_jsonl_append_on_a_full_disk_leaves_no_half_record(small_fs: Path) -> None:
    w = A.JsonlWriter(small_fs / "r.jsonl")
    w.append({"i": 0})
    _fill(small_fs)
    with pytest.raises(OSError) as e:
        w.append({"i": 1, "pad": "x" * 8000})
    assert e.value.errno == errno.ENOSPC
    assert (small_fs / "r.jsonl").read_bytes() == b'{"i":0}\n'  # the partial line was cut off
    (small_fs / "ballast").unlink()
    w.append({"i": 2})  # room again: appends on a clean line
    w.close()
    read = A.read_jsonl(small_fs / "r.jsonl")
    assert [r["i"] for r in read.records] == [0, 2] and read.torn == []


def test_parquet_on_a_full_disk_is_a_clear_error_and_no_file(small_fs: Path) -> None:
    rows = [A.CallRecord(rollout_id="r", call_id=f"c{i}", seq=i, protocol="openai-chat", model="m", started_at=0.0,
                         finished_at=0.0, prompt_ids=list(range(i, i + 2000)), output_ids=[1], output_logprobs=[0.0],
                         finish_reason="stop", policy_version=0) for i in range(40)]
    A.write_table(small_fs / "calls.parquet", rows[:1], A.CallRecord)
    good = (small_fs / "calls.parquet").read_bytes()
    _fill(small_fs)
    with pytest.raises(A.ArtifactError) as e:
        A.write_table(small_fs / "calls.parquet", rows, A.CallRecord)
    assert "no space left" in str(e.value) and "calls.parquet" in str(e.value)
    # the previous file is untouched and still reads; no temp file is left behind
    assert (small_fs / "calls.parquet").read_bytes() == good
    assert len(A.read_table(small_fs / "calls.parquet", A.CallRecord)) == 1
    assert sorted(p.name for p in small_fs.iterdir()) == ["ballast", "calls.parquet"]


def test_records_write_failure_is_logged_and_the_rollout_is_an_infra_error(tmp_path: Path, tiny_model: Path,
                                                                         monkeypatch, caplog) -> None:
    """ENOSPC injected into the recorder's writes (works anywhere): the harness got its answer, the
    record could not be kept — the rollout must not pass as complete."""
    from clawgym.rollout.proxy_client import ProxyClient

    real_write = A.JsonlWriter.append
    state = {"full": False}

    def append(self, record):
        if state["full"] and self.path.parent.name == "records":
            # what the real writer does on ENOSPC after a partial write: nothing kept, error raised
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, record)

    monkeypatch.setattr(A.JsonlWriter, "append", append)
    cfg = ProxyConfig(model_dir=tiny_model, engine="scripted", port=0, records_dir=tmp_path / "records", max_context=4096)
    with ProxyThread(cfg) as p:
        client = ProxyClient(p.url, p.server.admin_token, tmp_path / "records")
        reg = p.register("full", script=["one", "two"])
        body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        for i in range(2):
            if i == 1:
                client.settle("full", timeout=10)  # the first record is on disk before the disk "fills"
            state["full"] = i == 1
            req = urllib.request.Request(f"{p.url}/r/full/v1/chat/completions", data=body, method="POST",
                                         headers={"Authorization": f"Bearer {reg['api_key']}"})
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 200
        st = client.settle("full", timeout=10)
    assert st["calls_started"] == 2 and st["calls_recorded"] == 1
    assert any("could not write the record" in r.getMessage() and "No space left" in (r.exc_text or "")
               for r in caplog.records if r.name == "clawgym.proxy")
    assert [r.status for r in read_records(tmp_path / "records" / "full.jsonl")] == ["ok"]
    # The runner's check after settling turns this into an infra_error (next test).


@pytest.mark.slow
def test_a_rollout_whose_records_were_lost_is_an_infra_error(tmp_path: Path, tiny_model: Path, monkeypatch) -> None:
    real_write = A.JsonlWriter.append

    def append(self, record):
        if self.path.parent.name == "records" and self.path.name.startswith("full.") and record.get("seq") == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, record)

    monkeypatch.setattr(A.JsonlWriter, "append", append)
    make_task(tmp_path / "tasks", "full", **SAY_HI)
    s = script(tmp_path / "s.jsonl", {"full.agentloop.0": [tool_call("bash", command="true"), "Done."]})
    cfg = RolloutConfig(tasks=tmp_path / "tasks", harnesses=["agentloop"], out=tmp_path / "out", model=tiny_model,
                        engine="scripted", engine_options={"script": str(s)})
    summary = run_rollouts(cfg)
    (r,) = summary.rollouts
    assert r.status == "infra_error" and r.reward is None and "could not be recorded" in r.error
    calls = A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord)
    assert [c.seq for c in calls] == [0]


# --------------------------------------------------------------------------------------------
# A storm of engine errors
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_engine_error_storm_retries_recorded_and_dropped_by_build_trees(tmp_path: Path, tiny_model: Path) -> None:
    make_task(tmp_path / "tasks", "storm", **SAY_HI)
    # Every model call fails twice before it succeeds (the agentloop SDK client retries 3 times).
    boom = {"error": "engine overloaded"}
    items = {f"storm.agentloop.{i}": [boom, boom, tool_call("bash", command="echo hi > out.txt"), boom, boom, "Done."]
             for i in range(3)}
    s = script(tmp_path / "s.jsonl", items)
    cfg = RolloutConfig(tasks=tmp_path / "tasks", harnesses=["agentloop"], out=tmp_path / "out", group_size=3, concurrency=3,
                        model=tiny_model, engine="scripted", engine_options={"script": str(s)})
    summary = run_rollouts(cfg)
    assert [r.status for r in summary.rollouts] == ["ok"] * 3
    calls = A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord)
    for r in summary.rollouts:
        mine = sorted((c for c in calls if c.rollout_id == r.rollout_id), key=lambda c: c.seq)
        assert [c.status for c in mine] == ["engine_error", "engine_error", "ok"] * 2  # every retry recorded
        assert all(c.output_ids == [] for c in mine if c.status == "engine_error")
        tree = build_rollout_tree(mine, r)
        assert tree.stats.failed_calls == 4 and tree.stats.kept_leaves == 1 and tree.stats.decision == "kept"
        # Only sampled tokens of the ok calls are trained on; the failed attempts add no model node.
        kept_model = [n for n in tree.nodes if n.kept and n.kind == "model"]
        ok_outputs = sum(len(c.output_ids) for c in mine if c.status == "ok")
        assert sum(len(n.token_ids) for n in kept_model) == ok_outputs


# The tiny model's checkpoint is about 8 MB: 2.6 MB of weights, then 5.2 MB of AdamW moments. On a
# 10 MiB filesystem the second checkpoint runs out in safetensors' weights, on 13 MiB in torch.save's.
@pytest.mark.parametrize("size,writer", [("10m", "weights"), ("13m", "optimizer")])
def test_a_checkpoint_on_a_full_disk_is_one_clear_error_and_the_previous_one_stays(tmp_path: Path, tiny_model: Path,
                                                                                      size: str, writer: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from clawgym.train import checkpoint as C

    lm = AutoModelForCausalLM.from_pretrained(tiny_model)
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-3)
    lm(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()  # moments exist: optimizer.pt is twice the weights
    state = lambda n: C.TrainerState(algo="grpo", epochs=1, epochs_done=1, updates_done=n, complete=True, rollout_ids=[])
    with _tmpfs(tmp_path / "fs", size) as fs:
        out = fs / "ckpt"
        C.save_checkpoint(out, lm=lm, tokenizer_dir=tiny_model, optimizer=opt, state=state(1), config={"v": 1})
        v1 = {f.name: f.read_bytes() for f in out.iterdir()}
        with pytest.raises(A.ArtifactError) as e:
            C.save_checkpoint(fs / "ckpt-2", lm=lm, tokenizer_dir=tiny_model, optimizer=opt, state=state(2), config={"v": 2})
        message = str(e.value)
        assert "\n" not in message and message.startswith(f"{fs / 'ckpt-2'}: could not be written: no space left on device")
        cause = e.value.__cause__  # safetensors quotes the OS error; torch's zip writer has no errno, only a failed write
        assert ("No space left" in str(cause)) == (writer == "weights"), repr(cause)
        assert sorted(p.name for p in fs.iterdir()) == ["ckpt"]  # the partial files are gone
        assert {f.name: f.read_bytes() for f in out.iterdir()} == v1
        assert C.load_state(out).updates_done == 1


# --------------------------------------------------------------------------------------------
# A trainer killed while it saves a checkpoint
# --------------------------------------------------------------------------------------------

KILLED_SAVE = textwrap.dedent("""\
    import os, signal, sys
    from pathlib import Path
    import torch
    from transformers import AutoModelForCausalLM
    from clawgym.train import checkpoint as C

    model_dir, out, where = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    lm = AutoModelForCausalLM.from_pretrained(model_dir)
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-3)
    state = lambda n: C.TrainerState(algo="grpo", epochs=1, epochs_done=1, updates_done=n, complete=True, rollout_ids=[])
    C.save_checkpoint(out, lm=lm, tokenizer_dir=model_dir, optimizer=opt, state=state(1), config={"v": 1})
    print("saved v1", flush=True)
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(1.0)                                  # v2 differs everywhere
    die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    if where == "files":                                 # mid-way through writing the temp directory
        C.torch.save = die
    else:                                                # between `out -> out.old` and `tmp -> out`
        real = os.replace
        def replace(a, b):
            real(a, b)
            if ".old-" in Path(b).name:                  # the previous checkpoint was just moved aside
                die()
        C.os.replace = replace
    C.save_checkpoint(out, lm=lm, tokenizer_dir=model_dir, optimizer=opt, state=state(2), config={"v": 2})
    print("saved v2 (the kill did not happen)", flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["files", "between-renames"])
def test_trainer_killed_mid_checkpoint_keeps_the_previous_one(tmp_path: Path, tiny_model: Path, where: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from clawgym.train.checkpoint import load_state, recover

    out = tmp_path / "ckpt" / "policy"
    saver = tmp_path / "save.py"
    saver.write_text(KILLED_SAVE)
    r = subprocess.run([sys.executable, str(saver), str(tiny_model), str(out), where], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "saved v1" in r.stdout and "saved v2" not in r.stdout
    if where == "between-renames":
        assert not out.exists() and list(out.parent.glob("policy.old-*"))  # the instant the kill landed in
    recover(out)  # what `train --resume` and the loop do first
    assert load_state(out).updates_done == 1
    lm = AutoModelForCausalLM.from_pretrained(out)
    ref = AutoModelForCausalLM.from_pretrained(tiny_model)
    for (name, a), (_, b) in zip(lm.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), name  # v1 = the initial weights; v2 (all +1) never became visible
    assert sorted(p.name for p in out.parent.iterdir()) == ["policy"]  # temp and aside directories cleaned


# --------------------------------------------------------------------------------------------
# The sandbox deleted underneath a rollout
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sandbox_deleted_underneath_a_rollout(tmp_path: Path, tiny_model: Path) -> None:
    """Its folder removed while the harness works: that rollout ends (no hang) as an infra_error,
    excluded from training; the other rollout is untouched."""
    from clawgym.rollout.sandbox import default_base_dir

    make_task(tmp_path / "tasks", "del", **SAY_HI)
    s = script(tmp_path / "s.jsonl", {
        "del.agentloop.0": [tool_call("bash", command="sleep 4; echo hi > out.txt"), "Done."],
        "del.agentloop.1": [tool_call("bash", command="sleep 4; echo hi > out.txt"), "Done."],
    })
    cfg = RolloutConfig(tasks=tmp_path / "tasks", harnesses=["agentloop"], out=tmp_path / "out", group_size=2, concurrency=2,
                        model=tiny_model, engine="scripted", engine_options={"script": str(s)})
    box: dict = {}
    runner = threading.Thread(target=lambda: box.setdefault("summary", run_rollouts(cfg)), daemon=True)
    runner.start()
    deleted = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and deleted is None:
        for d in default_base_dir().glob("del.agentloop.0-*"):
            if (d / "workspace").is_dir() and any((d / "logs").glob("harness-*")):
                time.sleep(1.0)  # the harness is inside its `sleep 4` tool call
                shutil.rmtree(d)
                deleted = d
                break
        time.sleep(0.1)
    runner.join(120)
    assert deleted is not None and not runner.is_alive()
    by_id = {r.rollout_id: r for r in box["summary"].rollouts}
    hit, other = by_id["del.agentloop.0"], by_id["del.agentloop.1"]
    # a sandbox failure: excluded from training (reward null), never scored as if the work were there
    # the root cause is named whatever symptom arrived first (the harness may see its relay to the
    # proxy break before the runner sees the folder gone): never blamed on the model endpoint
    assert hit.status == "infra_error" and hit.reward is None, hit
    assert hit.error.startswith("sandbox gone: ") and "disappeared while the rollout ran" in hit.error, hit.error
    assert other.status == "ok" and other.reward == 1.0, other
