"""`clawgym run RECIPE.toml`: the whole RL loop, step after step, resumable (paper §3, Figure 1).

One step, read top to bottom (`run`):

1. collect — rollouts through the proxy serving the current policy → step-NNNN/{rollouts,calls}.parquet
2. reconstruct — build-trees → step-NNNN/trees.parquet
3. optimize — train on the trees → checkpoints/step-NNNN (HF format + trainer state)
4. sync — the proxy's engine reloads the new weights (policy_version = NNNN)
5. report — one metrics.jsonl line (rollout/ trees/ train/ eval/ time/), plots/*.png
6. evaluate — every `[eval] every` steps: Pass@1 of the current policy on the eval tasks

Every stage writes atomically and is skipped when its output is already complete, so `--resume`
after a kill at any moment continues from the last complete stage: the collect stage itself keeps
finished rollouts (results.jsonl) and reruns unfinished ones, so no rollout is lost or duplicated.
An `[offline] from_run` recipe skips collecting and trains on that run's saved trees.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import statistics
import time
import tomllib
from pathlib import Path

from rich.console import Console

from clawgym import artifacts as A
from clawgym import console as C
from clawgym import metric_names as M
from clawgym.config import Recipe, check_runnable, load_recipe, recipe_to_toml
from clawgym.errors import UserError
from clawgym.layout import RunLayout, StepLayout


def _complete_checkpoint(path: Path) -> bool:
    from clawgym.train.checkpoint import load_state

    state = load_state(path) if path.is_dir() else None
    return state is not None and state.complete


def _initial_policy(recipe: Recipe, run: RunLayout) -> Path:
    if recipe.model.path is not None:
        return recipe.model.path
    if recipe.model.init is None:  # an [offline] recipe without [model]: where the replayed run started
        from clawgym.offline import start_policy

        return start_policy(RunLayout(recipe.offline.from_run))
    path = run.model_init
    if not (path / "config.json").exists():
        from clawgym.model import init_model
        from clawgym.pretrained import PRETRAINED, init_pretrained

        if recipe.model.init in PRETRAINED:  # converted once per machine, then copied from the cache
            init_pretrained(path, recipe.model.init, force=True)
        else:
            init_model(path, seed=recipe.model.init_seed, size=recipe.model.init, force=True)
    return path


def _prepare(recipe: Recipe, resume: bool) -> RunLayout:
    """The run directory, checked against the recipe, with the recipe saved in it. `run` calls it
    after every check that can stop a run before any work (check_runnable), so a refused run leaves
    no recipe.toml behind and its rerun is not refused."""
    run = RunLayout(recipe.run_dir)
    text = recipe_to_toml(recipe)
    if run.recipe.exists() and not resume:
        raise UserError(f"{run.root} already holds a run; pass --resume to continue it, or choose another [run] name")
    if run.recipe.exists() and run.recipe.read_text() != text:
        old, new = _flat(tomllib.loads(run.recipe.read_text())), _flat(tomllib.loads(text))
        keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        raise UserError(f"{run.recipe} differs from {recipe.path} and its overrides ({', '.join(keys)}): a run resumes "
                        "with the recipe it started with")
    run.root.mkdir(parents=True, exist_ok=True)
    A.atomic_write_bytes(run.recipe, text.encode())
    return run


def _flat(doc: dict, prefix: str = "") -> dict[str, object]:
    """A TOML document's values by dotted key (train.lr, rollout.agentloop.max_tokens)."""
    out: dict[str, object] = {}
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def run(recipe_path: str | Path, *, overrides: list[str] | tuple[str, ...] = (), resume: bool = False,
        console: Console | None = None, verbose: bool = False) -> list[A.MetricsLine]:
    """The loop (module docstring). `overrides` ("train.lr=0.1") set recipe keys over the file's.
    `console` gets one line per step under a progress bar over the steps; with `verbose` every stage
    also prints its own tables there."""
    console = console or C.STDERR
    stages = console if verbose else C.QUIET
    recipe = load_recipe(recipe_path, overrides)
    check_runnable(recipe)  # harness options, [train] values, extras, tasks: before any file is written
    isolated = None
    if recipe.offline.from_run is None:  # before anything is written: a sandbox that cannot isolate files is refused
        from clawgym.rollout.sandbox import announce, isolation

        isolated = isolation(recipe.rollout.sandbox, recipe.rollout.network)
    run = _prepare(recipe, resume)
    if isolated is not None:
        announce(isolated, console)  # once the run is accepted, so a refused resume stays one line
    reported = {m.step for m in A.read_metrics(run.metrics)} if run.metrics.exists() else set()
    # the step after the last trained one (with [run] keep_last, earlier checkpoints may be gone)
    first = 1 + max((s for s in range(1, recipe.run.steps + 1) if _complete_checkpoint(run.step(s).checkpoint)), default=0)
    from clawgym.sinks import close_sinks, open_sinks

    sinks = open_sinks(run, tensorboard=recipe.log.tensorboard, wandb=recipe.log.wandb, name=recipe.run.name,
                       first_step=min([first, *(s for s in range(1, first) if s not in reported)]),
                       config=tomllib.loads(run.recipe.read_text()))  # the resolved recipe, plain values

    def report(line: A.MetricsLine) -> None:
        A.append_metrics(run.metrics, line)  # the source of truth first, then the sinks
        for sink in sinks:
            sink.write(line)
        reported.add(line.step)

    try:
        policy = _initial_policy(recipe, run)
        if recipe.offline.from_run is not None and first <= recipe.run.steps:
            from clawgym.offline import change_line, run_steps

            console.print(change_line(RunLayout(recipe.offline.from_run), run_steps(RunLayout(recipe.offline.from_run))[:recipe.run.steps],
                                      recipe.train, None if recipe.model.path is None and recipe.model.init is None else policy), highlight=False, soft_wrap=True)
        if recipe.sft.n and recipe.offline.from_run is None:  # the SFT cold start (coldstart.py), then RL from it
            from clawgym.coldstart import cold_start, sft_values

            with console.status("SFT cold start: teacher rollouts, SFT, evaluations") if not verbose else contextlib.nullcontext():
                policy = cold_start(recipe, run, policy, stages, rollout_config)
            if 0 not in reported:
                line = A.MetricsLine(0, sft_values(run), time=time.time())
                report(line)
                console.print(C.cold_start_line(line.values), highlight=False, soft_wrap=True)
        if first > 1:
            policy = run.step(first - 1).checkpoint
        with _proxy(recipe, run, policy, version=first - 1) as proxy, \
                C.StepProgress(console, recipe.run.steps, done=first - 1) as progress:
            for step in range(1, recipe.run.steps + 1):
                values = _step(recipe, run, step, policy, proxy, stages, progress, trained=step < first,
                               report=step not in reported)
                policy = run.step(step).checkpoint
                if values is not None:
                    line = A.MetricsLine(step, values, time=time.time())
                    report(line)
                    progress.finished(step, values, None if step < first else values["time/step_s"])
                    if recipe.run.keep_last:
                        prune_checkpoints(run, step, recipe.run.keep_last)
                    from clawgym.plots import write_plots

                    write_plots(run.root)
    finally:
        close_sinks(sinks)
    if recipe.sft.n and recipe.eval.every:
        from clawgym.coldstart import write_table

        write_table(run, console)
    return A.read_metrics(run.metrics)


def prune_checkpoints(run: RunLayout, step: int, keep_last: int) -> list[int]:
    """Remove the step checkpoints up to `step` but the last `keep_last`, the latest and the one
    with the best eval Pass@1 so far (the later on a tie); returns the steps removed."""
    steps = [s for s in range(1, step + 1) if run.step(s).checkpoint.is_dir()]
    kept = set(steps[-keep_last:]) | {step}
    scored = [(m.values["eval/pass@1"], m.step) for m in A.read_metrics(run.metrics)
              if "eval/pass@1" in m.values and 1 <= m.step <= step] if run.metrics.exists() else []
    if scored:
        kept.add(max(scored)[1])
    removed = [s for s in steps if s not in kept]
    for s in removed:
        shutil.rmtree(run.step(s).checkpoint)
    return removed


def _step(recipe: Recipe, run: RunLayout, step: int, policy: Path, proxy, stages: Console, progress: C.StepProgress,
          *, trained: bool, report: bool) -> dict[str, float] | None:
    """One step: the stages not yet done, then its metrics line's values (None: already reported)."""
    sdir = run.step(step)
    t0, times = time.monotonic(), {}

    def phase(name: str, key: str, work) -> None:
        progress.phase(step, name)
        t = time.monotonic()
        work()
        times[key] = time.monotonic() - t

    train_values: dict[str, float] = {}
    engine_values: dict[str, float] = {}
    if not trained:
        stages.rule(f"step {step}/{recipe.run.steps}")
        counts = _engine_counts(proxy)
        phase("rollouts", "time/collect_s", lambda: _collect(recipe, sdir, step, proxy, stages))
        engine_values = _engine_values(counts, _engine_counts(proxy))
        phase("trees", "time/reconstruct_s", lambda: _reconstruct(recipe, sdir, stages))
        phase("train", "time/optimize_s", lambda: train_values.update(_train_step(recipe, sdir, policy, step, stages)))
        if proxy is not None:
            phase("sync", "time/sync_s", lambda: proxy.admin("POST", "/admin/reload", {"checkpoint": str(sdir.checkpoint)}, timeout=600))
    if not report:
        return None
    if trained:  # trained before a resume, not yet reported: its train/ values from the same reduction
        train_values = _train_step(recipe, sdir, policy, step, stages)
    values = {**rollout_values(sdir), **engine_values, **trees_values(sdir), **train_values, **times}
    if recipe.eval.every and step % recipe.eval.every == 0 and proxy is not None:
        phase("eval", "time/eval_s", lambda: values.update(_evaluate(recipe, run, step, proxy, stages)))
        values["time/eval_s"] = times["time/eval_s"]
    values["time/step_s"] = time.monotonic() - t0
    return values


def _engine_counts(proxy) -> dict[str, float]:
    """The engine's cumulative prompt-token counters (the hf engine's prefix cache); {} when it reports none."""
    if proxy is None:
        return {}
    stats = proxy.admin("GET", "/admin/engine")["stats"]
    return {k: float(stats[k]) for k in ("prompt_tokens", "prompt_tokens_cached", "prompt_tokens_computed") if k in stats}


def _engine_values(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """A step's prefix-cache figures from the counters around its rollouts (docs/engines.md)."""
    sent = after.get("prompt_tokens", 0.0) - before.get("prompt_tokens", 0.0)
    if sent <= 0 or "prompt_tokens_cached" not in after:
        return {}
    return {M.PREFIX_HIT_RATE: (after["prompt_tokens_cached"] - before.get("prompt_tokens_cached", 0.0)) / sent,
            M.PROMPT_COMPUTED_SHARE: (after["prompt_tokens_computed"] - before.get("prompt_tokens_computed", 0.0)) / sent}


def _collect(recipe: Recipe, sdir: StepLayout, step: int, proxy, stages: Console) -> None:
    if recipe.offline.from_run is not None:
        _copy_offline(RunLayout(recipe.offline.from_run).step(step), sdir)
    elif not sdir.rollouts.exists():
        from clawgym.rollout.runner import run_rollouts

        run_rollouts(rollout_config(recipe, sdir.path, step, policy_version=step - 1), stages, proxy=proxy)


def _reconstruct(recipe: Recipe, sdir: StepLayout, stages: Console) -> None:
    if not sdir.trees.exists():
        from clawgym.trees import resolve_config, run_build_trees

        cfg = resolve_config(sdir.path, None, None, None, recipe.trees.max_leaves, sdir.trees_metrics, sdir.step)
        run_build_trees(cfg, stages)


def _proxy(recipe: Recipe, run: RunLayout, policy: Path, version: int):
    """One proxy for the whole run, serving `policy`; none for offline retraining."""
    if recipe.offline.from_run is not None:
        return contextlib.nullcontext(None)
    from clawgym.rollout.proxy_client import start_local_proxy

    cfg = dataclasses.replace(rollout_config(recipe, run.root, 0, version), model=policy)
    return start_local_proxy(cfg, run.records)  # one proxy for the run; copied into each step's records/


def rollout_config(recipe: Recipe, out: Path, step: int, policy_version: int, *, tasks: Path | None = None,
                   n: int | None = None, harnesses: list[str] | None = None):
    from clawgym.rollout.runner import RolloutConfig
    from clawgym.rollout.verifier import VerifierConfig

    ro = recipe.rollout
    return RolloutConfig(tasks=tasks or ro.tasks, harnesses=harnesses or ro.harnesses, out=out, n=n or ro.n,
                         concurrency=ro.concurrency, engine=recipe.engine.name, engine_options=dict(recipe.engine.options),
                         chat_template=recipe.engine.chat_template,
                         timeout_s=ro.timeout_s, sandbox=ro.sandbox, network=ro.network, step=step,
                         policy_version=policy_version, harness_options=ro.harness_options, verifier=VerifierConfig.with_judge(ro.judge_url, ro.judge_model),
                         ray=recipe.ray.address, ray_num_cpus=recipe.ray.num_cpus, proxy_host=recipe.ray.proxy_host,
                         tool_parser=recipe.engine.tool_parser,
                         # the step's draw from the pool; an eval or the teacher (tasks given) runs every task
                         tasks_per_step=ro.tasks_per_step if tasks is None else 0)


def _train_step(recipe: Recipe, sdir: StepLayout, policy: Path, step: int, stages: Console) -> dict[str, float]:
    """Train step `step` (a complete checkpoint is kept as it is); its train/ metrics, as train() reduces them."""
    from clawgym.train.loop import TrainConfig, train

    kwargs = {"seed": recipe.run.seed + step, **recipe.train}
    if recipe.offline.from_run is not None:  # the from_run step's recorded settings, changed only where [train] says
        from clawgym.offline import train_kwargs

        kwargs = train_kwargs(RunLayout(recipe.offline.from_run), step, recipe.train)
    # A batch with nothing to learn (every group flat) still writes the unchanged policy, so the
    # loop goes on; a batch with no trainable token at all (every rollout failed) stops the run.
    result = train(TrainConfig(trees=sdir.trees, rollouts=sdir.rollouts, model=policy, out=sdir.checkpoint,
                               metrics=sdir.train_metrics, resume=True, **kwargs), stages)
    return result.metrics


def _copy_offline(src: StepLayout, sdir: StepLayout) -> None:
    if not src.trees.exists():
        raise UserError(f"{src.path}: no trees.parquet to retrain on (the run has fewer steps, or they did not finish)")
    sdir.path.mkdir(parents=True, exist_ok=True)
    for name in ("rollouts", "calls", "trees"):
        source, dest = getattr(src, name), getattr(sdir, name)
        if source.exists() and not dest.exists():
            shutil.copy2(source, dest)


def rollout_values(sdir: StepLayout) -> dict[str, float]:
    """The rollout/ numbers of a step, from its rollouts.parquet and calls.parquet (names: metric_names.py)."""
    rollouts = A.read_table(sdir.rollouts, A.RolloutRecord)
    scored = [r.reward for r in rollouts if r.reward is not None]
    lengths = _response_lengths(sdir, [r.rollout_id for r in rollouts])
    turns = [r.n_calls for r in rollouts]
    values: dict[str, float] = {
        M.ROLLOUTS: len(rollouts),
        M.REWARD_MEAN: statistics.fmean(scored) if scored else 0.0,
        M.REWARD_STD: statistics.stdev(scored) if len(scored) > 1 else 0.0,  # sample std, as `rollout --json` and TRL
        M.INFRA_ERRORS: sum(r.status == "infra_error" for r in rollouts),
        M.TIMEOUTS: sum(r.status == "timeout" for r in rollouts),
        M.RESPONSE_LENGTH_MEAN: statistics.fmean(lengths) if lengths else 0.0,
        M.RESPONSE_LENGTH_MAX: max(lengths, default=0),
        M.TURNS_MEAN: statistics.fmean(turns) if turns else 0.0,
        M.TURNS_MAX: max(turns, default=0),
    }
    for h in sorted({r.harness for r in rollouts}):
        hs = [r.reward for r in rollouts if r.harness == h and r.reward is not None]
        values[f"{M.REWARD_MEAN}/{h}"] = statistics.fmean(hs) if hs else 0.0
    return values


def _response_lengths(sdir: StepLayout, rollout_ids: list[str]) -> list[int]:
    """Tokens each rollout's model calls sampled, in all (from calls.parquet's output_ids, read alone)."""
    if not sdir.calls.exists():
        return []
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(sdir.calls, columns=["rollout_id", "output_ids"])
    per_call = pc.list_value_length(table.column("output_ids")).to_pylist()
    totals = dict.fromkeys(rollout_ids, 0)
    for rid, n in zip(table.column("rollout_id").to_pylist(), per_call):
        if rid in totals:
            totals[rid] += n or 0
    return list(totals.values())


def trees_values(sdir: StepLayout) -> dict[str, float]:
    """The trees/ numbers of a step: the line build-trees wrote."""
    return dict(A.read_metrics(sdir.trees_metrics)[-1].values) if sdir.trees_metrics.exists() else {}


def step_values(sdir: StepLayout) -> dict[str, float]:
    """rollout/ trees/ train/ numbers of a finished step, from its files alone: `clawgym inspect` of a
    run whose stages were chained from the shell (no metrics.jsonl lines of its own). The train/
    numbers are reduced by the same table train() uses (train/step_metrics.py)."""
    from clawgym.train.step_metrics import reduce_updates

    values = {**rollout_values(sdir), **trees_values(sdir)}
    if sdir.train_metrics.exists():
        values.update(reduce_updates(A.read_jsonl(sdir.train_metrics).records))
    return values


def _evaluate(recipe: Recipe, run: RunLayout, step: int, proxy, console: Console) -> dict[str, float]:
    from clawgym.eval import evaluate

    tasks = recipe.eval.tasks or recipe.rollout.tasks
    cfg = rollout_config(recipe, run.eval(step).path, 0, step, tasks=tasks, n=recipe.eval.n,
                         harnesses=recipe.eval.harnesses or None)
    cfg = dataclasses.replace(cfg, id_prefix=f"e{step:04d}.")
    report = evaluate(cfg, console, proxy=proxy)
    report.print(console)
    return {f"eval/{k}": v for k, v in report.metrics().items()}
