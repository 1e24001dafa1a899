"""docs/results.md, the one place measured figures live: each bench (and any measured command) writes
its own section there, keyed by its command, replaced in place on every run.

    python3 bench/train.py --harness --write-results         # any bench: run it, then write its section
    python3 bench/results_md.py clawgym run recipes/quickstart.toml   # any command (a recipe's measured run)
    python3 bench/results_md.py --small                       # the writer's self-check, in a temp file

Every bench builds its argparse parser and calls `parse(ap)` instead of `ap.parse_args()`. That adds
`--write-results`: the bench then runs itself again as a child process without the flag, its output
(stdout and stderr) shown as it comes and kept, and when the child exits 0 the section for that command is written with
the date, the machine (CPUs, load average before and after), the wall time, the children's peak RSS
and the output. A failed run writes nothing. The same runner serves a command given to this script.
Sections are found by their marker line, so reruns replace their own section and leave the others
as they are; nothing in docs/results.md is edited by hand.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"
PARSE_ONLY = "CLAWGYM_BENCH_PARSE_ONLY"  # set: parse(ap) exits 0 once the arguments parse (tests/test_benches.py)
MARK = "<!-- results: {key} -->"
PHASE_PEAKS = re.compile(r"\| peak GiB ([^|\n]*)")
"""a `clawgym run` step line's per-phase peaks (console.step_line): `| peak GiB rollout 4.6  train 9.2 |`"""
END = "<!-- end results -->"
HEADER = """# Measured results

Every section below was written by the command in its heading (`bench/results_md.py`): run a bench
with `--write-results`, or any command as `python3 bench/results_md.py COMMAND...`, and its section
is replaced in place. Nothing here is edited by hand. Figures depend on the machine and on what
else ran on it, so each section names both; the docs link here instead of quoting figures.
"""


def command_key(argv: list[str]) -> str:
    """The command as a reader would type it from the repository root: `python3 bench/X.py ARGS`."""
    argv = [a for a in argv if a != "--write-results"]
    if argv and argv[0].endswith(".py"):
        path = Path(argv[0]).resolve()
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else argv[0]
        argv = ["python3", name, *argv[1:]]
    # a folder or file of this machine's outside the repository is the reader's own: DIR, FILE
    argv = [argv[0], *(("DIR" if Path(a).is_dir() else "FILE") if Path(a).is_absolute() and Path(a).exists()
                       and not Path(a).resolve().is_relative_to(ROOT) else a for a in argv[1:])]
    return shlex.join(argv)


def parse(ap: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """ap.parse_args() with `--write-results` added; with it, run this bench again and write its section."""
    ap.add_argument("--write-results", action="store_true",
                    help=f"run, then write the output as this command's section of {RESULTS.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    if os.environ.get(PARSE_ONLY):
        raise SystemExit(0)
    if args.write_results:
        if getattr(args, "small", False):
            ap.error("--write-results with --small: --small is a correctness check, not a measurement")
        raw = sys.argv[1:] if argv is None else argv
        rest = [a for a in raw if a != "--write-results"]
        raise SystemExit(record([sys.executable, sys.argv[0], *rest], command_key([sys.argv[0], *rest])))
    return args


def machine() -> str:
    """CPUs, architecture, Python, and the GPUs nvidia-smi lists, if any."""
    gpus = []
    if shutil.which("nvidia-smi"):
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
        gpus = [g.strip() for g in proc.stdout.splitlines() if g.strip()] if proc.returncode == 0 else []
    gpu = f", {len(gpus)} × {gpus[0]}" if gpus else ""
    return f"{os.cpu_count()} CPUs{gpu}, {os.uname().machine}, Python {sys.version.split()[0]}"


PROGRESS = re.compile(r"\d+%\|[^|]*\| *\d+/\d+ \[")
"""a progress bar's line (tqdm's, as transformers prints while loading weights): shown, not written"""


def record(cmd: list[str], key: str, results: Path = RESULTS) -> int:
    """Run cmd, echo and keep its output (stderr too: `clawgym run` prints its steps there); on exit 0 write
    `key`'s section of results. Returns cmd's exit code."""
    load0, t0 = os.getloadavg()[0], time.monotonic()
    env = {**os.environ, "COLUMNS": os.environ.get("COLUMNS", "200")}  # rich tables at full width in a pipe
    out: list[str] = []
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    except OSError as e:
        print(f"results_md: cannot run `{key}`: {e.strerror}", file=sys.stderr)
        return 1
    with proc:
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                out.append(line)
        except KeyboardInterrupt:  # the child got the same SIGINT; record nothing from a cut run
            proc.wait()
            print(f"results_md: `{key}` interrupted; {results} left as it was", file=sys.stderr)
            return 130
    wall, load1 = time.monotonic() - t0, os.getloadavg()[0]
    if proc.returncode != 0:
        print(f"results_md: `{key}` exited {proc.returncode}; {results} left as it was", file=sys.stderr)
        return proc.returncode
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
    peak = f"peak RSS of a process {rss:.2f} GiB"
    phases = [float(x) for m in PHASE_PEAKS.finditer("".join(out)) for x in re.findall(r"\d+\.\d+", m[1])]
    if phases:  # `clawgym run` resets the kernel's high-water mark at each phase, so ru_maxrss is its last phase's
        peak = f"peak RSS {max(phases + [rss]):.2f} GiB (the largest phase peak its step lines report)"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = (f"Measured {when} · {machine()} · load average {load0:.1f} → {load1:.1f} · "
            f"wall {wall:.0f} s · {peak}\n\n```text\n"
            + re.sub(r"\x1b\[[0-9;]*m", "", "".join(line for line in out if not PROGRESS.search(line))).rstrip() + "\n```\n")
    write_section(results, key, body)
    print(f"results_md: wrote `{key}` in {results}", file=sys.stderr)
    return 0


def sections(text: str) -> dict[str, str]:
    """key -> body of every section in a results file's text."""
    found = {}
    for m in re.finditer(r"<!-- results: (.*?) -->\n(.*?)" + re.escape(END), text, re.S):
        found[m.group(1)] = m.group(2)
    return found


def write_section(results: Path, key: str, body: str) -> None:
    """Replace key's section in place, or append it; written atomically (a temp file renamed over)."""
    text = results.read_text(encoding="utf-8") if results.exists() else HEADER
    block = f"{MARK.format(key=key)}\n## `{key}`\n\n{body.rstrip()}\n{END}"
    pattern = re.compile(re.escape(MARK.format(key=key)) + r"\n.*?" + re.escape(END), re.S)
    text = pattern.sub(lambda _: block, text, count=1) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    fd, tmp = tempfile.mkstemp(dir=results.parent, prefix=".results-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, results)


def self_check() -> int:
    """--small: two commands recorded into a temp file, the first rerun; it must be replaced in place."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "results.md"
        py = [sys.executable, "-c"]
        assert record([*py, "print('| a | 1 |')"], "first", path) == 0
        bar = "Loading weights: 100%|##########| 272/272 [00:00<00:00, 7722.02it/s]"
        assert record([*py, f"print('two'); print({bar!r})"], "second", path) == 0
        assert record([*py, "print('| a | 2 |')"], "first", path) == 0
        assert record([*py, "raise SystemExit(3)"], "second", path) == 3
        line = "step 1/2  reward 0.500 ± 0.100 | rollout 1m02s  train 9s | peak GiB rollout 1.5  train 7.25 | ETA 1m"
        assert record([*py, f"print({line!r})"], "run", path) == 0
        text = path.read_text(encoding="utf-8")
        found = sections(text)
        assert list(found) == ["first", "second", "run"], found
        assert "peak RSS 7.25 GiB (the largest phase peak" in found["run"], found["run"]
        assert "| a | 2 |" in found["first"] and "| a | 1 |" not in text, text
        assert "two" in found["second"] and "Loading weights" not in text, text
    print("results_md: sections written, replaced in place, kept on failure")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="check the writer on a temp file, < 1 s")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command to run and record")
    a = ap.parse_args()
    if os.environ.get(PARSE_ONLY):
        return 0
    if a.small:
        return self_check()
    if not a.command:
        ap.error("give a command to run, e.g. `clawgym run recipes/quickstart.toml`, or --small")
    return record(a.command, shlex.join(a.command))


if __name__ == "__main__":
    sys.exit(main())
