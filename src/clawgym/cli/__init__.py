"""The `clawgym` command line: a table of contents of the pipeline, one short function per command.

Each command only parses its arguments and calls the stage that does the work; stages exchange
files on disk (see `artifacts/`). Errors a user can cause surface as one line on stderr: exit 2
for usage errors (Typer's own), exit 1 for runtime errors (`UserError`, `ArtifactError`). The
stages a shell script chains (rollout, build-trees, train, eval, sync) take `--json`: their result
as one JSON object on stdout, everything else on stderr (`app.json_result`; docs/recipes.md).

The commands, in the order `clawgym --help` lists them: stages.py (init-model, serve-proxy,
rollout, build-trees, train, sync), runs.py (run, eval, compare, replay, mismatch, inspect),
setup.py (tasks, harness); app.py holds the Typer app they register on.
"""

from __future__ import annotations

import sys

from rich.text import Text

from clawgym.cli.app import AFTER_STOP, STOP_SIGNALS, app, err
from clawgym.errors import UserError

# Each module registers its commands on `app` when imported: this order is --help's order.
from clawgym.cli import stages  # noqa: E402,F401,I001
from clawgym.cli import runs  # noqa: E402,F401
from clawgym.cli import setup  # noqa: E402,F401


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be, so it takes the same clean path (open sandboxes closed,
    finished rollouts and checkpoints kept): a script's trap, a CI timeout and `docker stop` send it."""


def _terminate(signum: int, frame: object) -> None:
    STOP_SIGNALS.append(signum)
    raise _Terminated()


def _interrupt(signum: int, frame: object) -> None:
    STOP_SIGNALS.append(signum)
    raise KeyboardInterrupt()


def _raised_by_a_stop(error: BaseException) -> bool:
    """Whether a stop signal's interrupt is in `error`'s cause chain: code the signal landed in may wrap
    what it catches (Python 3.11 turns an exception in a class body's `__set_name__`, as in an import
    under way, into a RuntimeError whose cause is the interrupt)."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _stopped() -> None:
    """One line and the shell's status for a stop signal: 143 after SIGTERM, 130 after SIGINT."""
    import signal

    term = signal.SIGTERM in STOP_SIGNALS
    err.print(("terminated (SIGTERM)" if term else "interrupted (SIGINT)") + "".join(f"; {h}" for h in AFTER_STOP[-1:]),
              highlight=False, soft_wrap=True)
    sys.exit(143 if term else 130)


def main() -> None:
    """Console entry point: run the app, turning expected failures into one line and exit 1
    (130 after Ctrl-C or SIGINT, 143 after SIGTERM)."""
    import os
    import signal

    from clawgym.artifacts import ArtifactError

    # models are directories here: nothing asks a hub unless the user turns this off for a hub id
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # transformers' and the hub's tqdm bars ("Loading weights") would break the one-line-per-step output
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    STOP_SIGNALS.clear()  # this call's signals only (main() also runs in-process, e.g. under a test runner)
    AFTER_STOP.clear()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, _terminate)
    if handlers[signal.SIGINT] is signal.default_int_handler:  # an ignored SIGINT (a background job) stays ignored
        signal.signal(signal.SIGINT, _interrupt)
    try:
        app()
    except (UserError, ArtifactError) as e:
        # the message as written: it names sections and extras in brackets ([train], 'clawgym[lora]'), not markup
        err.print(Text("error: ", style="bold red") + Text(str(e)), highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        _stopped()
    except SystemExit:
        if STOP_SIGNALS:
            _stopped()
        raise
    except Exception as e:
        if STOP_SIGNALS and _raised_by_a_stop(e):
            _stopped()
        raise
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    main()
