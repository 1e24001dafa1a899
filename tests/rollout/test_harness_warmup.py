"""The install-time warm-up: the stand-in endpoint through the official `openai` SDK, and OpenClaw's
compile cache, filled by one real `agent exec` turn and then only read by a sandboxed run (which
would otherwise compile every module again and write a cache of its own to its fresh TMPDIR).
The OpenClaw half skips, with the adapter's reason, where OpenClaw is not installed; the fill into
an empty folder is in the heavy tier (pytest -m heavy), the default run reads the install's cache."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from clawgym.errors import UserError
from clawgym.rollout.harnesses.base import Endpoint
from clawgym.rollout.harnesses.openclaw import OpenClaw
from clawgym.rollout.harnesses.warmup import REPLY, answering_endpoint
from clawgym.rollout.sandbox import ProxyEndpoint, SandboxConfig, open_sandbox


def test_the_stand_in_endpoint_answers_chat_completions_streamed_and_not() -> None:
    with answering_endpoint() as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        done = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert (done.choices[0].message.content, done.choices[0].finish_reason) == (REPLY, "stop")
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY
        assert chunks[-1].choices[0].finish_reason == "stop"
    with pytest.raises(openai.APIConnectionError):  # gone with the block
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


class _OwnCache(OpenClaw):
    """The installed OpenClaw with its compile cache in a test folder, not the install's."""

    def __init__(self, cache: Path, **options) -> None:
        super().__init__(**options)
        self._cache = cache

    def compile_cache(self) -> Path:
        return self._cache


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def _sandboxed_run_reads_only(harness: OpenClaw, cache: Path, tmp_path: Path) -> None:
    """One sandboxed `agent exec` turn: it finds the cache in its environment, succeeds, writes
    nothing to its TMPDIR and leaves the cache as it was (the sandbox shows it read-only)."""
    before = _files(cache)
    with answering_endpoint() as url:
        port = int(url.rsplit(":", 1)[1])
        with open_sandbox("local", None, SandboxConfig(proxy=ProxyEndpoint(port))) as sb:
            launch = harness.launch("Reply with ok.", Path(sb.path_inside(sb.workspace)), Path(sb.path_inside(sb.home)),
                                    Endpoint(f"http://127.0.0.1:{port}", "k"))
            assert launch.env["NODE_COMPILE_CACHE"] == str(cache)
            launch.write_files(Path(sb.home))
            run = sb.run(launch.argv, env=launch.env, timeout=300, name="harness")
            assert harness.outcome(run.exit_code, run.stdout(), run.stderr()).status == "ok", run.stdout()[-500:]
            assert not any(sb.tmp.iterdir()), f"OpenClaw wrote to its TMPDIR: {sorted(p.name for p in sb.tmp.iterdir())}"
    assert _files(cache) == before


@pytest.mark.slow
@pytest.mark.harness
def test_a_sandboxed_openclaw_run_only_reads_the_compile_cache_its_install_filled(tmp_path: Path) -> None:
    """The default run's half: the cache `clawgym harness install openclaw` filled (prepare() fills
    it first where an older install made none)."""
    harness = OpenClaw(slim=True, max_tokens=16, timeout_s=300)
    if (why := harness.missing()) is not None:
        pytest.skip(why)
    harness.prepare()
    filled = _files(harness.compile_cache())
    assert len(filled) > 100, f"the install's compile cache holds {len(filled)} files"
    harness.prepare()  # filled: nothing to do
    assert _files(harness.compile_cache()) == filled
    _sandboxed_run_reads_only(harness, harness.compile_cache(), tmp_path)


@pytest.mark.heavy
@pytest.mark.harness
def test_openclaw_fills_its_compile_cache_once_and_a_sandboxed_run_only_reads_it(tmp_path: Path) -> None:
    """The fill itself, into an empty folder: a cold compile of every module (minutes on 2 cores,
    hence the heavy tier; the install runs the same warm-up on every machine)."""
    if (why := OpenClaw().missing()) is not None:
        pytest.skip(why)
    cache = tmp_path / "compile-cache"
    harness = _OwnCache(cache, slim=True, max_tokens=16, timeout_s=300)
    assert "NODE_COMPILE_CACHE" not in harness.launch("x", tmp_path, tmp_path / "home", Endpoint("http://h", "k")).env
    harness.prepare()  # no cache yet: one warm-up turn fills it
    before = _files(cache)
    assert len(before) > 100, f"the warm-up left {len(before)} cache files"
    harness.prepare()  # filled: nothing to do
    assert _files(cache) == before
    _sandboxed_run_reads_only(harness, cache, tmp_path)


def test_a_failed_warm_up_is_one_line_and_prepare_carries_on(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    if (why := OpenClaw().missing()) is not None:
        pytest.skip(why)

    class Broken(_OwnCache):
        def entry(self) -> Path:  # a launcher that exits at once with an error
            script = tmp_path / "broken.mjs"
            script.write_text("console.error('no such module'); process.exit(3)\n")
            return script

    harness = Broken(tmp_path / "cache")
    with pytest.raises(UserError, match=r"failed its warm-up turn \(exit code 3: no such module\), so its compile cache is not filled"):
        harness.warm_compile_cache()
    harness.prepare()
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("warning: ") and "each rollout compiles OpenClaw's modules at its start" in err[-1]
