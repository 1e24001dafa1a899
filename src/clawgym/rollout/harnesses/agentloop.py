"""`agentloop`: the built-in harness — a small ReAct loop over OpenAI Chat Completions (paper §4.6).

It runs as its own process in the sandbox, like any other harness (`python -m
clawgym.rollout.harnesses.agentloop INSTRUCTION`), talks to the proxy over Chat Completions with
`httpx` (`OPENAI_BASE_URL`, `OPENAI_API_KEY`; retries as the official SDK does), and works in its
current directory, the workspace:

1. messages = [system, user(instruction)]; tools = bash, read, write, edit, python (or the subset
   given by `--tools`: a shorter prompt for small models);
2. each turn: one model call; every tool call in the answer is executed and its result appended;
   an answer without tool calls is the final answer (optionally saved to `--answer-file`);
3. when a call's prompt + output nears `--context-window` tokens, a compaction call (no tools)
   summarizes the work so far, and the conversation restarts from the instruction + that summary —
   so trees see compaction segments;
4. `--max-turns` bounds the loop; `--max-tokens` and `--temperature` go into every call,
   `--tool-timeout` bounds each bash/python tool run, `--request-timeout` each model call.

It does not import the `openai` SDK: that import alone cost 1.4 CPU s (openai 3.57 builds every
pydantic type), most of a small rollout, paid again by every rollout's process (docs/harnesses.md,
"What a rollout costs"). The proxy's compatibility with the official SDKs is tested with the SDKs
themselves (tests/proxy/test_proxy_sdk.py).

Exit codes: 0 finished (final answer or turn limit), 4 the model endpoint failed after the
retries (the runner marks the rollout infra_error), 5 the prompt no longer fits the model's context
window (the endpoint's `context_length_exceeded`: the policy's own ending, a scored harness_error),
6 the rollout's call budget is spent (the endpoint's `call_budget_exhausted`, `[rollout] max_calls`:
scored as it stands), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from clawgym.errors import UserError
from clawgym.rollout.harnesses.base import Endpoint, Launch, Outcome, check_option, exit_text

if TYPE_CHECKING:
    from clawgym.artifacts import Transcript

SYSTEM_PROMPT = (
    "You are an agent working in a Linux workspace (your current directory). "
    "Use the tools to inspect and change files, then reply with a short final answer without tool calls."
)
COMPACTION_PROMPT = (
    "Your context is nearly full. Summarize the task, what you have done, the current state of the "
    "workspace and what remains, so that you can continue from the summary alone."
)
TOOL_OUTPUT_LIMIT = 4000
EXIT_ENDPOINT_FAILED = 4
EXIT_CONTEXT_FULL = 5
EXIT_BUDGET_SPENT = 6

TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command in the workspace.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {"name": "read", "description": "Read a text file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "write", "description": "Write a text file (replaces it).",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}}},
    {"type": "function", "function": {"name": "edit", "description": "Replace the first occurrence of old with new in a file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}, "required": ["path", "old", "new"]}}},
    {"type": "function", "function": {"name": "python", "description": "Run Python code; prints its output.",
     "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}},
]


# --- the adapter (runs in the rollout runner) -------------------------------------------------------


# `python -c ENTRY ARGS` rather than `-m`: the package imports this module first, and runpy would
# warn about running it again as __main__ on every rollout's stderr.
ENTRY = "import sys; from clawgym.rollout.harnesses.agentloop import agent_main; sys.exit(agent_main())"


class AgentLoop:
    name = "agentloop"
    protocol = "openai-chat"

    def __init__(self, max_turns: int = 8, max_tokens: int = 256, context_window: int = 4096,
                 temperature: float = 1.0, answer_file: str | None = None, tool_timeout: float = 60.0,
                 request_timeout: float = 600.0, tools: list[str] | None = None):
        for key, value in (("max_turns", max_turns), ("max_tokens", max_tokens), ("context_window", context_window)):
            check_option("agentloop", key, value, int, 1)
        check_option("agentloop", "temperature", temperature, (int, float), 0)
        check_option("agentloop", "tool_timeout", tool_timeout, (int, float), 0, strict=True)
        check_option("agentloop", "request_timeout", request_timeout, (int, float), 0, strict=True)
        if answer_file is not None and not isinstance(answer_file, str):
            raise UserError(f"agentloop option 'answer_file' must be a path string, got {answer_file!r}")
        self.max_turns, self.max_tokens, self.context_window = max_turns, max_tokens, context_window
        self.temperature, self.answer_file = float(temperature), answer_file
        self.tool_timeout, self.request_timeout = float(tool_timeout), float(request_timeout)
        unknown = sorted(set(tools or ()) - {t["function"]["name"] for t in TOOLS})
        if unknown or tools == []:
            raise UserError(f"agentloop option 'tools' must name some of {', '.join(t['function']['name'] for t in TOOLS)}; got {tools}")
        self.tools = tools

    def missing(self) -> str | None:
        return None  # built in: needs only this Python

    def launch(self, instruction: str, workspace: Path, home: Path, endpoint: Endpoint) -> Launch:
        from clawgym.rollout.sandbox_local import PACKAGE_ROOT  # here, not at the top: the agent process skips it

        argv = [sys.executable, "-c", ENTRY, "--max-turns", str(self.max_turns),
                "--max-tokens", str(self.max_tokens), "--context-window", str(self.context_window),
                "--temperature", str(self.temperature), "--tool-timeout", str(self.tool_timeout),
                "--request-timeout", str(self.request_timeout), "--model", endpoint.model]
        if self.answer_file:
            argv += ["--answer-file", self.answer_file]
        if self.tools:
            argv += ["--tools", ",".join(self.tools)]
        env = {"OPENAI_BASE_URL": endpoint.base_url.rstrip("/") + "/v1", "OPENAI_API_KEY": endpoint.api_key,
               # the same clawgym as the runner's, whatever the sandbox's Python would find first
               "PYTHONPATH": str(PACKAGE_ROOT)}
        return Launch(argv=argv + ["--", instruction], env=env)

    def outcome(self, exit_code: int, stdout: str, stderr: str) -> Outcome:
        if exit_code == 0:
            final = None
            for line in reversed(stdout.splitlines()):
                if line.startswith('{"event": "done"'):
                    final = json.loads(line).get("final")
                    break
            return Outcome("ok", final_message=final)
        if exit_code == EXIT_ENDPOINT_FAILED:
            return Outcome("infra_error", _last_line(stderr) or "model endpoint failed")
        # EXIT_CONTEXT_FULL, like any other exit, is the policy's ending (docs/harnesses.md, "Context window")
        return Outcome("harness_error", exit_text(exit_code, _last_line(stderr)))

    def transcript(self, stdout: str, calls: list[dict]) -> "Transcript":
        # imported here: the agent process in the sandbox imports this module and needs none of it
        from clawgym.rollout.transcript import from_proxy

        return from_proxy(calls)  # its stdout log cuts texts at 200 characters: the proxy has them whole

    def classify(self, tool_names: list[str], last_user_text: str, main_tool_names: list[str]) -> str:
        # Only the compaction call goes out without tools.
        return "main" if tool_names else "compaction"


def _last_line(text: str) -> str:
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else ""


# --- the agent program (runs in the sandbox) --------------------------------------------------------


def _truncate(text: str) -> str:
    if len(text) <= TOOL_OUTPUT_LIMIT:
        return text
    half = TOOL_OUTPUT_LIMIT // 2
    return f"{text[:half]}\n[... {len(text) - TOOL_OUTPUT_LIMIT} characters cut ...]\n{text[-half:]}"


def _inside(path: str) -> Path:
    """Tool paths are relative to the workspace; refuse ones that leave it."""
    root = Path.cwd().resolve()
    p = (root / path).resolve()
    if p != root and root not in p.parents:
        raise ValueError(f"path {path!r} is outside the workspace")
    return p


def run_tool(name: str, args: dict, timeout: float = 60.0) -> str:
    """Execute one tool call in the current directory; errors come back as text for the model."""
    try:
        if name == "bash":
            r = subprocess.run(["bash", "-c", str(args["command"])], capture_output=True, text=True, timeout=timeout)
            return _truncate(f"exit code {r.returncode}\n{r.stdout}{r.stderr}")
        if name == "python":
            r = subprocess.run([sys.executable, "-c", str(args["code"])], capture_output=True, text=True, timeout=timeout)
            return _truncate(f"exit code {r.returncode}\n{r.stdout}{r.stderr}")
        if name == "read":
            return _truncate(_inside(args["path"]).read_text(errors="replace"))
        if name == "write":
            p = _inside(args["path"])
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(str(args["content"]))
            return f"wrote {len(str(args['content']))} characters to {args['path']}"
        if name == "edit":
            p = _inside(args["path"])
            text = p.read_text()
            if args["old"] not in text:
                return f"error: the text to replace was not found in {args['path']}"
            p.write_text(text.replace(args["old"], args["new"], 1))
            return f"edited {args['path']}"
        return f"error: unknown tool {name!r}; available: {', '.join(t['function']['name'] for t in TOOLS)}"
    except KeyError as e:
        return f"error: missing argument {e.args[0]!r} for tool {name}"
    except subprocess.TimeoutExpired:
        return f"error: {name} timed out after {timeout:.0f} s"
    except (OSError, ValueError, TypeError) as e:
        return f"error: {e}"


def _log(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class EndpointError(Exception):
    """The endpoint's answer was an error (after retries); `code` is its `error.code`, if any."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


# Retried like the official SDK: connection errors, timeouts and these statuses, with exponential
# backoff from 0.5 s (at most 8 s), or the server's Retry-After when it is short.
RETRY_STATUSES = {408, 409, 429} | set(range(500, 600))


class ChatClient:
    """Chat Completions over httpx: `create(**body)` → the response JSON (a dict), or EndpointError."""

    def __init__(self, base_url: str, api_key: str, timeout: float, max_retries: int = 3):
        import httpx

        self.httpx, self.max_retries = httpx, max_retries
        # Certificates are loaded only for https (0.1 CPU s a process): the sandbox's relay is plain http.
        self.client = httpx.Client(base_url=base_url.rstrip("/") + "/", timeout=timeout, verify=base_url.startswith("https:"),
                                   headers={"Authorization": f"Bearer {api_key}"})

    def create(self, **body) -> dict:
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                r = self.client.post("chat/completions", json=body)
            except self.httpx.HTTPError as e:  # connection refused or reset, timeouts
                if last:
                    raise EndpointError(f"{type(e).__name__}: {e}") from None
                time.sleep(min(8.0, 0.5 * 2 ** attempt))
                continue
            if r.status_code < 400:
                return r.json()
            if r.status_code not in RETRY_STATUSES or last:
                raise _error_of(r)
            wait = r.headers.get("retry-after", "")
            time.sleep(float(wait) if wait.replace(".", "", 1).isdigit() and float(wait) <= 60 else min(8.0, 0.5 * 2 ** attempt))
        raise AssertionError("unreachable")


def _error_of(r) -> EndpointError:
    try:
        err = r.json().get("error") or {}
    except (ValueError, AttributeError):  # not JSON, or not a JSON object
        err = {}
    err = err if isinstance(err, dict) else {"message": str(err)}
    return EndpointError(f"Error code: {r.status_code} - {err.get('message') or r.text[:300]}", r.status_code, err.get("code"))


def agent_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="agentloop", description="clawgym's built-in ReAct agent over OpenAI Chat Completions.")
    ap.add_argument("instruction")
    ap.add_argument("--model", default=os.environ.get("CLAWGYM_MODEL", "clawgym-policy"))
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--context-window", type=int, default=4096)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--answer-file", default=None, help="save the final answer to this file in the workspace")
    ap.add_argument("--tool-timeout", type=float, default=60.0, help="seconds each bash or python tool call may run")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="seconds each model call may take (per try)")
    ap.add_argument("--tools", default=None, help="offer only these tools (comma-separated): a shorter prompt")
    args = ap.parse_args(argv)
    tools = [t for t in TOOLS if args.tools is None or t["function"]["name"] in args.tools.split(",")]

    client = ChatClient(os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"), os.environ.get("OPENAI_API_KEY", ""),
                        timeout=args.request_timeout)

    def ask(messages: list[dict], **kw):
        """One model call: the response's message and usage, or the exit code when the endpoint cannot answer it."""
        try:
            resp = client.create(model=args.model, messages=messages, max_completion_tokens=args.max_tokens,
                                 temperature=args.temperature, **kw)
            return resp["choices"][0]["message"], (resp.get("usage") or {}).get("total_tokens") or 0
        except EndpointError as e:
            if e.status == 400 and e.code == "context_length_exceeded":  # nothing more fits: the run ends here, as the policy left it
                print(f"context window exceeded: {e}", file=sys.stderr)
                return EXIT_CONTEXT_FULL
            if e.status == 400 and e.code == "call_budget_exhausted":  # the runner's bound on calls: ends here too
                print(f"call budget spent: {e}", file=sys.stderr)
                return EXIT_BUDGET_SPENT
            print(f"model endpoint failed: {e}", file=sys.stderr)
            return EXIT_ENDPOINT_FAILED
        except (ValueError, LookupError, TypeError, AttributeError) as e:  # not a Chat Completions answer
            print(f"model endpoint failed: malformed response ({type(e).__name__}: {e})", file=sys.stderr)
            return EXIT_ENDPOINT_FAILED

    start = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": args.instruction}]
    messages = list(start)
    final = ""
    for turn in range(args.max_turns):
        answer = ask(messages, tools=tools)
        if isinstance(answer, int):
            return answer
        msg, used = answer
        content = msg.get("content") or ""
        calls = [(c.get("id", ""), c["function"]["name"], c["function"].get("arguments") or "{}") for c in msg.get("tool_calls") or []]
        assistant = {"role": "assistant", "content": content}
        if calls:
            assistant["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]
        messages.append(assistant)
        _log("turn", turn=turn, text=content[:200], tools=[n for _, n, _ in calls])
        if not calls:
            final = content
            break
        for call_id, name, arguments in calls:
            try:
                tool_args = json.loads(arguments)
                if not isinstance(tool_args, dict):
                    raise ValueError("arguments must be a JSON object")
                result = run_tool(name, tool_args, timeout=args.tool_timeout)
            except ValueError as e:
                result = f"error: bad arguments for {name}: {e}"
            messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
            _log("tool", name=name, result=result[:200])
        if used > 0.8 * args.context_window:
            compacted = ask(messages + [{"role": "user", "content": COMPACTION_PROMPT}])
            if isinstance(compacted, int):
                return compacted
            summary = compacted[0].get("content") or ""
            messages = start + [{"role": "user", "content": f"Summary of your earlier work:\n{summary}\nContinue the task."}]
            _log("compaction", tokens=used)
    if args.answer_file:
        try:
            _inside(args.answer_file).write_text(final)
        except (OSError, ValueError) as e:
            print(f"could not save the answer: {e}", file=sys.stderr)
    _log("done", final=final)
    return 0


if __name__ == "__main__":
    sys.exit(agent_main())
