"""Benchmark what every rollout pays before its agent does anything, against baselines in the same run.

1. Sandbox: open a local sandbox (the machine's best network mode, bubblewrap where it works), run
   `true` in it and close it, vs `true` started as a plain subprocess. Wall time per rollout, and
   the CPU the runner's own process spends on it.
2. Harness start: the built-in agentloop process up to its first request (Python start, the
   agentloop module, its httpx client made) vs a bare `python -c pass`, and vs the same start with
   the official `openai` SDK's client (what agentloop used before), all run in such a sandbox.
   CPU seconds of the process itself.
3. Verifier start: a Python check script's process (`python3 -c pass` as the toy tasks' check.py
   starts) in the sandbox, for scale.
4. Docker vs bubblewrap: the docker sandbox's open + `true` + close (a container started and
   removed) and one more command in an open sandbox, against the local sandbox's, when an engine
   with the base image answers (scripts/docker-engine.sh start); skipped, saying why, otherwise.
5. OpenClaw (slim) from start to exit on one answered call, in a sandbox, with the compile cache its
   install filled vs without it (Node compiles every module again, into the sandbox's fresh
   TMPDIR), and without its plugins (slim's setting) vs with them loaded (the request is the same:
   tests/rollout/test_openclaw_slim.py): CPU seconds of its whole process tree. The stand-in
   endpoint of the install's warm-up answers the call. Skipped, saying why, where OpenClaw is not
   installed.

CPU is counted by a small probe that runs the command and reads its children's rusage: under
bubblewrap's pid namespace the runner's own rusage never sees the sandboxed processes (their
namespace's init reaps them), so `/usr/bin/time` around a rollout run undercounts.

    python bench/rollout_start.py              # 8 repeats each
    python bench/rollout_start.py --repeats 3  # quicker
    python bench/rollout_start.py --small      # one repeat of the sandbox rows: a correctness check
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import clawgym
from clawgym.rollout.harnesses.agentloop import ENTRY
from clawgym.rollout.harnesses.base import Endpoint
from clawgym.rollout.harnesses.openclaw import OpenClaw
from clawgym.rollout.harnesses.warmup import answering_endpoint
from clawgym.rollout.sandbox import ProxyEndpoint, SandboxConfig, open_sandbox
from clawgym.rollout.sandbox_docker import prepare_engine

import results_md  # bench/results_md.py: --write-results

PACKAGE_ROOT = str(Path(clawgym.__file__).resolve().parents[1])
# Runs argv[1:] and prints the CPU seconds (user + sys) it and its children used, as JSON.
PROBE = ("import json, resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
         "r = resource.getrusage(resource.RUSAGE_CHILDREN); print(json.dumps(r.ru_utime + r.ru_stime))")
# The agentloop process's start, as ENTRY makes it, stopped before its first request.
MODULE_START = ENTRY.split(";")[1].strip()
HARNESS_START = MODULE_START + "; from clawgym.rollout.harnesses.agentloop import ChatClient; ChatClient('http://127.0.0.1:9/v1', 'k', 60)"
SDK_START = MODULE_START + "; import openai; openai.OpenAI(api_key='k', base_url='http://127.0.0.1:9/v1')"


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def sandbox_start(repeats: int, network: str, kind: str = "local") -> tuple[list[float], list[float], str]:
    """Wall seconds of open + run `true` + close, and the runner's CPU seconds, per repeat."""
    walls, cpus, mode = [], [], ""
    for _ in range(repeats):
        t, c = time.perf_counter(), self_cpu()
        with open_sandbox(kind, None, SandboxConfig(network=network)) as sb:
            r = sb.run(["true"], timeout=60)
            mode = sb.network
            root = sb.root
        walls.append(time.perf_counter() - t)
        cpus.append(self_cpu() - c)
        if not r.ok or root.exists():
            sys.exit(f"{kind}: true failed in the sandbox, or its folder outlived it: {r.stderr()[-500:]}")
    return walls, cpus, mode


def command_cost(repeats: int, network: str, kind: str) -> list[float]:
    """Wall seconds of one more command (`echo`, its output checked) in an open sandbox, per repeat."""
    walls = []
    with open_sandbox(kind, None, SandboxConfig(network=network)) as sb:
        for i in range(repeats):
            t = time.perf_counter()
            r = sb.run(["echo", str(i)], timeout=60)
            walls.append(time.perf_counter() - t)
            if not r.ok or r.stdout().strip() != str(i):
                sys.exit(f"{kind}: echo {i} printed {r.stdout()!r} (exit {r.exit_code})")
    return walls


def docker_rows(n: int, network: str, local_wall: float) -> None:
    """Section 4: the docker sandbox against the local one, or why it is skipped."""
    local_cmd = command_cost(n, network, "local")
    if (problem := prepare_engine(SandboxConfig().image)) is not None:
        print(f"4. docker vs bubblewrap: skipped ({problem}); local command {median(local_cmd) * 1000:.0f} ms")
        return
    walls, cpus, _ = sandbox_start(n, network, "docker")
    cmd = command_cost(n, network, "docker")
    print(f"4. docker sandbox open+run+close: {median(walls) * 1000:.0f} ms wall (runner CPU {median(cpus) * 1000:.0f} ms) "
          f"vs local {local_wall * 1000:.0f} ms: x{median(walls) / local_wall:.1f}; one more command "
          f"{median(cmd) * 1000:.0f} ms vs {median(local_cmd) * 1000:.0f} ms: x{median(cmd) / median(local_cmd):.1f}")


def bare_start(repeats: int) -> list[float]:
    walls = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(["true"], check=True)
        walls.append(time.perf_counter() - t)
    return walls


def probed_cpu(sb, argv: list[str], env: dict[str, str], timeout: float) -> float:
    """CPU seconds of `argv` and its children in the open sandbox `sb`, counted by the probe."""
    r = sb.run([sys.executable, "-I", "-S", "-c", PROBE, *argv], timeout=timeout, env=env)
    if not r.ok:
        sys.exit(f"{Path(argv[0]).name} failed in the sandbox: {r.stderr()[-500:]}")
    return json.loads(r.stdout().strip().splitlines()[-1])


def cpu_in_sandbox(code: str, repeats: int, network: str) -> list[float]:
    """CPU seconds of `python -c CODE` in a fresh sandbox, per repeat."""
    out = []
    for _ in range(repeats):
        with open_sandbox("local", None, SandboxConfig(network=network)) as sb:
            out.append(probed_cpu(sb, [sys.executable, "-c", code], {"PYTHONPATH": PACKAGE_ROOT}, 120))
    return out


def openclaw_cpu(repeats: int, network: str, cached: bool, plugins: bool = False) -> list[float]:
    """CPU seconds of slim OpenClaw answering one call in a fresh sandbox, per repeat (with its
    plugins loaded, as installed, where `plugins`)."""
    harness, out = OpenClaw(slim=True, max_tokens=16), []
    harness.prepare()
    with answering_endpoint() as url:
        port = int(url.rsplit(":", 1)[1])
        for _ in range(repeats):
            with open_sandbox("local", None, SandboxConfig(network=network, proxy=ProxyEndpoint(port))) as sb:
                launch = harness.launch("Reply with ok.", Path(sb.path_inside(sb.workspace)), Path(sb.path_inside(sb.home)),
                                        Endpoint(f"http://127.0.0.1:{port}", "k"))
                if plugins:
                    config = json.loads(launch.files["openclaw.json5"])
                    del config["plugins"]
                    launch = dataclasses.replace(launch, files={"openclaw.json5": json.dumps(config)})
                launch.write_files(Path(sb.home))
                env = launch.env if cached else {k: v for k, v in launch.env.items() if k != "NODE_COMPILE_CACHE"}
                out.append(probed_cpu(sb, launch.argv, env, 600))
    return out


def openclaw_rows(n: int, network: str) -> None:
    """Section 5: OpenClaw's start with and without its install's compile cache, or why it is skipped."""
    if (why := OpenClaw().missing()) is not None:
        print(f"5. OpenClaw start: skipped ({why})")
        return
    cold, warm = openclaw_cpu(n, network, cached=False), openclaw_cpu(n, network, cached=True)
    loaded = openclaw_cpu(n, network, cached=True, plugins=True)
    print(f"5. OpenClaw (slim) start to exit on one call: {median(warm):.2f} CPU s with its install's compile cache "
          f"vs {median(cold):.2f} CPU s compiling in the sandbox: x{median(warm) / median(cold):.2f}; "
          f"without its plugins (slim) vs with them loaded: {median(warm):.2f} vs {median(loaded):.2f} CPU s: "
          f"x{median(warm) / median(loaded):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--network", default="auto", help="sandbox network mode (default: auto)")
    ap.add_argument("--small", action="store_true", help="one repeat of the sandbox rows (1 and 4): a quick correctness check")
    args = results_md.parse(ap)
    n = 1 if args.small else args.repeats

    if args.small:
        walls, _, mode = sandbox_start(n, args.network)
        print(f"sandbox network mode: {mode}; --small: 1 repeat")
        print(f"1. sandbox open+run+close: {median(walls) * 1000:.0f} ms wall")
        docker_rows(n, args.network, median(walls))
        return

    bare = bare_start(n)
    walls, runner_cpu, mode = sandbox_start(n, args.network)
    python = cpu_in_sandbox("pass", n, args.network)
    harness = cpu_in_sandbox(HARNESS_START, n, args.network)
    sdk = cpu_in_sandbox(SDK_START, n, args.network)
    import openai  # noqa: E402  (its version, for the record)

    print(f"sandbox network mode: {mode}; openai {openai.__version__}; {n} repeats, medians")
    print(f"1. sandbox open+run+close: {median(walls) * 1000:.0f} ms wall (runner CPU {median(runner_cpu) * 1000:.0f} ms) "
          f"vs bare subprocess {median(bare) * 1000:.1f} ms: x{median(walls) / median(bare):.0f}")
    print(f"2. agentloop start (module + httpx client): {median(harness):.2f} CPU s "
          f"vs bare python {median(python):.3f} CPU s: x{median(harness) / median(python):.1f}; "
          f"with the openai SDK's client instead: {median(sdk):.2f} CPU s (x{median(sdk) / median(harness):.1f} the httpx start)")
    print(f"3. verifier-like python start: {median(python):.3f} CPU s; the agentloop start is "
          f"{median(harness) - median(python):.2f} CPU s more per rollout")
    docker_rows(n, args.network, median(walls))
    openclaw_rows(n, args.network)


if __name__ == "__main__":
    main()
