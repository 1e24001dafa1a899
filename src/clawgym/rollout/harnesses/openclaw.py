"""`openclaw`: the OpenClaw agent (`openclaw agent exec`), unmodified, against the proxy's Chat Completions route.

From driving the real program (docs/harnesses.md, "openclaw"): OpenClaw needs Node ≥ 24 (under
Node 20 npm silently installs an empty 0.0.1 placeholder), so we install Node 24 from npm next to
it. `agent exec` is its headless entry point; a per-run JSON5 config points a custom provider at
the proxy. It rewrites tool-call ids (drops `_`), which the proxy's matching tolerates. Start-up is
slow (tens of seconds and over a gigabyte of RSS on a small machine): give it a generous timeout.
Part of that start is compiling its JavaScript, which Node caches in TMPDIR by default, fresh in every
sandbox; `install` fills a compile cache next to the install with one run, and every launch points
Node at it (docs/harnesses.md, "openclaw").

As installed, its first prompt does not fit a small model's 8k window. `slim` turns off, through
documented config keys, what a rollout does not use: the skills list, workspace bootstrap files,
its plugins (the memory plugin among them), and every tool but a short allowlist (`tools`), which
also drops the deferred-tool catalog and its search tools. The sections OpenClaw always writes stay
(docs/harnesses.md, "openclaw").
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from clawgym.artifacts import Transcript
from clawgym.errors import UserError
from clawgym.rollout.harnesses import npm
from clawgym.rollout.harnesses.base import Endpoint, Launch, Outcome, check_flag, check_option, classify_by_tools, exit_text
from clawgym.rollout.transcript import from_proxy

VERSION = "2026.9.6"
PACKAGE = f"openclaw@{VERSION}"
_COMPACTION_MARKERS = ("summarize the conversation", "compaction summary", "<summary>")
# the tools `slim` keeps unless `tools` names others: a shell, and files read, written and edited
SLIM_TOOLS = "exec,read,write,edit"
# OpenClaw's tool names and groups (`group:fs`), and `*` globs
_TOOL_NAME = re.compile(r"[A-Za-z0-9_*:-]+")


class OpenClaw(npm.NpmHarness):
    """Runs `openclaw.mjs` on its own Node 24, so `install` and `missing` cover both."""

    name = "openclaw"
    protocol = "openai-chat"
    package, bin_name, title = PACKAGE, "openclaw", f"OpenClaw {VERSION} (with Node 24)"

    def __init__(self, context_window: int = 32768, max_tokens: int = 4096, timeout_s: int = 600, slim: bool = False,
                 tools: str | None = None):
        for key, value in (("context_window", context_window), ("max_tokens", max_tokens), ("timeout_s", timeout_s)):
            check_option(self.name, key, value, int, 1)
        check_flag(self.name, "slim", slim)
        self.context_window, self.max_tokens, self.timeout_s, self.slim = context_window, max_tokens, timeout_s, slim
        self.tools = _tool_list(tools if tools is not None else SLIM_TOOLS if slim else None)
        """the tools OpenClaw may offer, or None for its own set"""

    def entry(self) -> Path:
        return self.folder / "node_modules" / "openclaw" / "openclaw.mjs"

    def compile_cache(self) -> Path:
        """Node's compile cache for OpenClaw's modules, filled at install; rollouts only read it."""
        return self.folder / "compile-cache"

    def install(self) -> Path:
        node_bin = npm.node24_bin()
        npm.npm_install(self.folder, [PACKAGE], node_bin=node_bin)
        self.warm_compile_cache()
        return self.entry()

    def prepare(self) -> None:
        """Fill the compile cache of an install made without one (before clawgym filled it at
        install); if that fails, say so in one line and let rollouts compile as before."""
        if (self.compile_cache() / f"filled-{VERSION}").exists():
            return
        print(f"{self.title}: filling its compile cache, once", file=sys.stderr)
        try:
            self.warm_compile_cache()
        except UserError as e:
            print(f"warning: {e}; each rollout compiles OpenClaw's modules at its start", file=sys.stderr)

    def warm_compile_cache(self, timeout_s: float = 300.0) -> None:
        """One `agent exec` turn with this adapter's options (at install, OpenClaw as installed,
        which loads every module a slim run does and more) against a stand-in endpoint, with Node's
        compile cache at `compile_cache()`. Node keys each entry by the module's path and content,
        so a reinstall or another version only adds entries."""
        # here, not at the top: only an install (or an older install's first stage) serves a warm-up,
        # and http.server would otherwise load with every command that imports the runner
        from clawgym.rollout.harnesses.warmup import answering_endpoint

        with tempfile.TemporaryDirectory(prefix="clawgym-openclaw-warmup-") as tmp, answering_endpoint() as url:
            home, workspace = Path(tmp) / "home", Path(tmp) / "workspace"
            home.mkdir()
            workspace.mkdir()
            launch = self.launch("Reply with ok.", workspace, home, Endpoint(base_url=url, api_key="warmup"))
            launch.write_files(home)
            env = launch.env | {"HOME": str(home), "TMPDIR": str(home), "NODE_COMPILE_CACHE": str(self.compile_cache())}
            try:
                r = subprocess.run(launch.argv, env=env, cwd=workspace, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise UserError(f"{self.title} did not finish its warm-up turn within {timeout_s:.0f} s, so its "
                                "compile cache is not filled") from None
        if r.returncode != 0 or not self.compile_cache().is_dir():
            why = self.outcome(r.returncode, r.stdout, r.stderr).message or exit_text(r.returncode)
            raise UserError(f"{self.title} failed its warm-up turn ({why}), so its compile cache is not filled")
        (self.compile_cache() / f"filled-{VERSION}").touch()  # what `prepare` looks for

    def missing(self) -> str | None:
        if not (npm.node24_dir() / "node").exists() or not self.entry().exists():
            return f"{self.title} is not installed (run: clawgym harness install {self.name})"
        return None

    def launch(self, instruction: str, workspace: Path, home: Path, endpoint: Endpoint) -> Launch:
        config = {
            "agents": {"defaults": {"model": {"primary": f"clawgym/{endpoint.model}"}}},
            "models": {"mode": "replace", "providers": {"clawgym": {
                "baseUrl": endpoint.base_url.rstrip("/") + "/v1", "apiKey": endpoint.api_key, "api": "openai-completions",
                "timeoutSeconds": self.timeout_s,
                "models": [{"id": endpoint.model, "name": endpoint.model, "reasoning": False, "input": ["text"],
                            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                            "contextWindow": self.context_window, "maxTokens": self.max_tokens}],
            }}},
        }
        if self.tools is not None:
            # exactly these tools, each with its schema in the request: no deferred-tool catalog behind
            # tool_search (`toolSearch`), and no apply_patch, which allowing `write` adds on its own
            config["tools"] = {"allow": self.tools, "toolSearch": False}
            if "apply_patch" not in self.tools:
                config["tools"]["deny"] = ["apply_patch"]
        if self.slim:
            # no skills list; no AGENTS.md/SOUL.md/... injected from the workspace (not even their
            # "[MISSING]" markers); no plugins: the memory plugin's recall section and tools go, and
            # each start skips finding and loading the rest, which add nothing to a slim prompt
            config["agents"]["defaults"] |= {"skills": [], "contextInjection": "never"}
            config["plugins"] = {"enabled": False}
        node_bin = npm.node24_dir()
        argv = [str(node_bin / "node"), str(self.entry()), "agent", "exec", instruction, "--config",
                str(home / "openclaw.json5"), "--cwd", str(workspace), "--model", f"clawgym/{endpoint.model}", "--json",
                "--timeout", str(self.timeout_s)]
        env = {"OPENCLAW_STATE_DIR": str(home / ".openclaw"), "OPENCLAW_NO_AUTO_UPDATE": "1", "OPENCLAW_DISABLE_BONJOUR": "1",
               # its workers may spawn `node`: Node 24 first on PATH
               "PATH": f"{node_bin}:/usr/local/bin:/usr/bin:/bin"}
        if self.compile_cache().is_dir():
            # read-only in a sandbox: Node reads the install's entries and skips writing its own
            env["NODE_COMPILE_CACHE"] = str(self.compile_cache())
        return Launch(argv=argv, env=env, files={"openclaw.json5": json.dumps(config, indent=2)})

    def outcome(self, exit_code: int, stdout: str, stderr: str) -> Outcome:
        result = _last_json_object(stdout)
        if exit_code == 0 and isinstance(result, dict) and result.get("ok"):
            return Outcome("ok", final_message=result.get("final"))
        if exit_code == 2:
            return Outcome("ok", "OpenClaw's own timeout")  # scored as is
        text = json.dumps(result)[:300] if result else (stderr.strip().splitlines() or [""])[-1][:300]
        if any(s in text.lower() for s in ("econnrefused", "fetch failed", "overloaded", "503", "529")):
            return Outcome("infra_error", f"model endpoint failed: {text}")
        return Outcome("harness_error", exit_text(exit_code, text))

    def transcript(self, stdout: str, calls: list[dict]) -> Transcript:
        return from_proxy(calls)  # `--json` prints a summary (final text, tool counts), not the conversation

    def classify(self, tool_names: list[str], last_user_text: str, main_tool_names: list[str]) -> str:
        if any(m in last_user_text.lower() for m in _COMPACTION_MARKERS):
            return "compaction"
        return classify_by_tools(tool_names, main_tool_names)


def _tool_list(tools: str | None) -> list[str] | None:
    """The `tools` option ("exec,read,write") as OpenClaw's `tools.allow` list; None stays None."""
    if tools is None:
        return None
    names = [t.strip() for t in tools.split(",")] if isinstance(tools, str) else []
    if not names or not all(_TOOL_NAME.fullmatch(t) for t in names):
        raise UserError(f"openclaw option 'tools' must be comma-separated tool names (e.g. {SLIM_TOOLS}), got {tools!r}")
    return names


def _last_json_object(stdout: str) -> dict | None:
    """The last JSON object on stdout. `--json` pretty-prints it over many lines (and may follow
    other output), so read from each line that opens an object, last first, to a full document."""
    decoder = json.JSONDecoder()
    offsets, pos = [], 0
    for line in stdout.splitlines(keepends=True):
        if line.startswith("{"):
            offsets.append(pos)
        pos += len(line)
    for off in reversed(offsets):
        try:
            obj, _ = decoder.raw_decode(stdout, off)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    return None
