"""OpenClaw's slim settings against the real program: slim turns its plugins off (`plugins.enabled:
false`), and the request it sends is the one it sends with them loaded, so what that saves is
start-up work alone (bench/rollout_start.py, row 5). Skips, with the adapter's reason, where
OpenClaw is not installed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clawgym.rollout.harnesses.base import Endpoint, Launch
from clawgym.rollout.harnesses.openclaw import OpenClaw
from clawgym.rollout.harnesses.warmup import answering_endpoint
from clawgym.rollout.sandbox import ProxyEndpoint, SandboxConfig, open_sandbox

pytestmark = [pytest.mark.slow, pytest.mark.harness]

# what differs between any two runs: the session's id and the minute in the first user message
_PER_RUN = [(re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "UUID"),
            (re.compile(r"\[\w{3} \d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC\]"), "[TIME]")]


class PluginsLoaded(OpenClaw):
    """Slim with OpenClaw's plugins as installed (its memory plugin among them)."""

    def launch(self, instruction: str, workspace: Path, home: Path, endpoint: Endpoint) -> Launch:
        launch = super().launch(instruction, workspace, home, endpoint)
        config = json.loads(launch.files["openclaw.json5"])
        del config["plugins"]
        return Launch(argv=launch.argv, env=launch.env, files={"openclaw.json5": json.dumps(config)})


def first_request(harness: OpenClaw) -> str:
    """The first request body the harness sends in a sandbox, with what differs per run masked."""
    received: list[dict] = []
    with answering_endpoint(received) as url:
        port = int(url.rsplit(":", 1)[1])
        with open_sandbox("local", None, SandboxConfig(proxy=ProxyEndpoint(port))) as sb:
            launch = harness.launch("List the files here.", Path(sb.path_inside(sb.workspace)),
                                    Path(sb.path_inside(sb.home)), Endpoint(f"http://127.0.0.1:{port}", "k"))
            launch.write_files(Path(sb.home))
            run = sb.run(launch.argv, env=launch.env, timeout=300, name="harness")
            assert harness.outcome(run.exit_code, run.stdout(), run.stderr()).status == "ok", run.stdout()[-500:]
    assert received, "OpenClaw sent no request"
    text = json.dumps(received[0], sort_keys=True, indent=1)
    for pattern, mask in _PER_RUN:
        text = pattern.sub(mask, text)
    return text


def test_slim_sends_the_same_request_without_its_plugins_as_with_them() -> None:
    if (why := OpenClaw().missing()) is not None:
        pytest.skip(why)
    options = {"slim": True, "max_tokens": 16, "timeout_s": 300}
    assert json.loads(OpenClaw(**options).launch("x", Path("/w"), Path("/h"), Endpoint("http://h", "k"))
                      .files["openclaw.json5"])["plugins"] == {"enabled": False}
    without_plugins, loaded = first_request(OpenClaw(**options)), first_request(PluginsLoaded(**options))
    assert without_plugins == loaded
    tools = [t["function"]["name"] for t in json.loads(without_plugins)["tools"]]
    assert sorted(tools) == ["edit", "exec", "read", "write"]
