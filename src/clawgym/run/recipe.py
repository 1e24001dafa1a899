"""Recipes: one TOML file, one section per stage, validated into typed dataclasses.

    [run]      name, dir, steps, seed, keep_last, max_staleness (asynchronous steps)
    [model]    path = "models/tiny"   or   init = "tiny" | "small" | a pretrained name (smollm2-135m-instruct), init_seed = 0
    [engine]   name = "hf", tool_parser = "auto", chat_template = FILE | shipped name, and engine options
    [rollout]  tasks, harnesses, group_size, concurrency, timeout_s, max_calls, tasks_per_step, sandbox, network, judge_url, judge_model
    [rollout.<harness>]  that harness adapter's options (e.g. [rollout.agentloop] max_tokens = 8)
    [trees]    max_leaves
    [train]    any `clawgym train` option (algo, lr, epochs, minibatches, tis, kl_coef, ...)
    [eval]     every (steps; 0 = never), tasks, samples_per_task, harnesses
    [sft]      demonstrations, tasks, harnesses, engine, family, epochs, minibatches, lr, min_reward: an SFT cold start on
               teacher trajectories before step 1 (coldstart.py)
    [offline]  from_run: train on a finished run's saved trees instead of collecting rollouts
    [ray]      address, num_cpus: fan each step's rollouts out as Ray tasks
    [log]      tensorboard = true, wandb = {project, mode, ...}: metrics sinks beside metrics.jsonl (sinks.py)

Every key is checked: an unknown section or key, a value of the wrong type or below its floor, is a `UserError`
naming the file, the section and the key. Paths are relative to the recipe's folder. The resolved
recipe (defaults filled, paths absolute) is saved in the run directory as recipe.toml.

The sections' dataclasses are in sections.py; this module reads, checks and writes a recipe.
A recipe becomes the stages' configs only through its methods: `Recipe.rollout_config` (a step's
rollouts; `eval_config`, `sft_rollout_config` for an evaluation and the teacher), `train_config`
(a step's training) and `sft_train_config` (the cold start's).
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawgym.console import STDERR
from clawgym.engines.registry import RELOADS_IN_PLACE, check_engine
from clawgym.errors import UserError, did_you_mean
from clawgym.fields import default_of, field_of, from_text, reference, typed
from clawgym.layout import RunLayout
from clawgym.models.pretrained import PRETRAINED
from clawgym.models.templates import SHIPPED, load_chat_template
from clawgym.models.tiny import SIZES
from clawgym.proxy.config import SERVE_SKIP, ProxyConfig
from clawgym.proxy.toolparse import check_name
from clawgym.rollout.config import HARNESS_NAMES, JudgeChoice, RolloutConfig
from clawgym.run.replay import train_kwargs
from clawgym.run.sections import (RENAMED_KEYS, SFT_SHARED_TRAIN_KEYS, EngineSection, EvalSection, LogSection, ModelSection,
                                  OfflineSection, RaySection, RolloutSection, RunSection, SftSection, TreesSection)
from clawgym.run.sinks import check_wandb_options
from clawgym.tasks.writer import dump_toml
from clawgym.train.config import PER_CALL, TrainConfig


@dataclass
class Recipe:
    path: Path
    run: RunSection
    model: ModelSection
    engine: EngineSection
    rollout: RolloutSection
    trees: TreesSection
    train: dict[str, Any]
    """[train]: the TrainConfig fields the recipe sets, by name, checked against TrainConfig's types
    (only those given: the saved recipe and an [offline] replay's overrides name exactly these);
    `train_config` makes the step's TrainConfig, every other field at TrainConfig's default"""
    eval: EvalSection
    sft: SftSection
    offline: OfflineSection
    ray: RaySection
    log: LogSection = dataclasses.field(default_factory=LogSection)

    @property
    def run_dir(self) -> Path:
        return self.run.dir or self.path.parent / "runs" / self.run.name

    def rollout_config(self, out: Path, step: int, policy_version: int, *, model: Path | None = None) -> RolloutConfig:
        """Step `step`'s rollouts into `out`, by the policy `policy_version` (`model`: served by a
        proxy the stage starts): [rollout]'s keys and judge, [engine], [ray], the step's draw of tasks."""
        return self._rollout(out, step=step, policy_version=policy_version, model=model,
                             tasks_per_step=self.rollout.tasks_per_step)

    def eval_config(self, out: Path, policy_version: int, id_prefix: str, *, model: Path | None = None) -> RolloutConfig:
        """An evaluation of the policy `policy_version`: every [eval] task (default: the rollout tasks),
        [eval] samples_per_task each, with [eval]'s harnesses (default: the rollout harnesses)."""
        e = self.eval
        return self._rollout(out, tasks=e.tasks or self.rollout.tasks, group_size=e.samples_per_task or self.rollout.group_size,
                             harnesses=e.harnesses or self.rollout.harnesses, policy_version=policy_version,
                             id_prefix=id_prefix, model=model)

    def sft_rollout_config(self, model: Path) -> RolloutConfig:
        """The cold start's teacher rollouts into RUN/sft: [sft]'s tasks, demonstrations, harnesses and engine
        (with `sft_engine_options`), `model`'s tokenizer."""
        s = self.sft
        return self._rollout(RunLayout(self.run_dir).sft.path, tasks=s.tasks or self.rollout.tasks,
                             group_size=s.demonstrations or self.rollout.group_size, harnesses=s.harnesses or self.rollout.harnesses, model=model, engine=s.engine,
                             engine_options=self.sft_engine_options(), id_prefix="sft.", tasks_per_step=s.tasks_per_step)

    def train_settings(self) -> dict[str, Any]:
        """Every TrainConfig setting a step trains with: [train]'s keys over TrainConfig's defaults."""
        return {**{f.name: default_of(f) for f in dataclasses.fields(TrainConfig) if f.name not in PER_CALL}, **self.train}

    def planned_train_config(self) -> TrainConfig:
        """`train_settings` on step 0's paths: what the checks before a run validate (an [offline]
        recipe's steps take the recorded settings, changed where [train] says)."""
        asynchronous = {"max_staleness": self.run.max_staleness, "policy_version": 0} if self.run.max_staleness else {}
        return _train_config(RunLayout(self.run_dir).step(0), Path("."), self.train_settings() | asynchronous)

    def sft_engine_options(self) -> dict[str, Any]:
        """The [sft] engine's options: the recipe's [engine] options, with [sft] `family` as the option 'family'."""
        return dict(self.engine.options) | ({"family": self.sft.family} if self.sft.family is not None else {})

    def _rollout(self, out: Path, **given: Any) -> RolloutConfig:
        """The RolloutConfig of [rollout] (its keys are RolloutConfig's fields), [engine] and [ray],
        with `given` fields set over them; an evaluation runs every task (tasks_per_step 0), the teacher [sft]'s draw."""
        ro, engine, ray = self.rollout, self.engine, self.ray
        keys = {f.name: getattr(ro, f.name) for f in dataclasses.fields(RolloutSection) if f.name in _ROLLOUT_FIELDS}
        return RolloutConfig(**{**keys, "out": out, "engine": engine.name, "engine_options": dict(engine.options),
                                "chat_template": engine.chat_template, "tool_parser": engine.tool_parser,
                                "verifier": JudgeChoice(ro.judge_url, ro.judge_model).verifier(), "ray": ray.address,
                                "ray_num_cpus": ray.num_cpus, "proxy_host": ray.proxy_host, "tasks_per_step": 0, **given})

    def train_config(self, step: int, policy: Path) -> TrainConfig:
        """Step `step`'s training of `policy` on the step's trees into its checkpoint (a complete one
        is kept): [train]'s keys, the seed `[run] seed + step` unless [train] gives one; an [offline]
        recipe's step trains with the settings its `from_run` recorded, changed where [train] says."""
        settings = {"seed": self.run.seed + step, **self.train}
        if self.offline.from_run is not None:
            settings = train_kwargs(RunLayout(self.offline.from_run), step, self.train)
        if self.run.max_staleness:  # the trainer's weights are step - 1's: the bound is over versions, not steps
            settings |= {"max_staleness": self.run.max_staleness, "policy_version": step - 1}
        return _train_config(RunLayout(self.run_dir).step(step), policy, settings)

    def sft_train_config(self, policy: Path) -> TrainConfig:
        """The cold start's `train --algo sft` of `policy` on the teacher trees in RUN/sft: [sft]'s
        epochs, minibatches, lr and min_reward, the run's seed, and [train]'s `SFT_SHARED_TRAIN_KEYS`."""
        s = self.sft
        shared = {k: v for k, v in self.train.items() if k in SFT_SHARED_TRAIN_KEYS}
        return _train_config(RunLayout(self.run_dir).sft, policy, {"algo": "sft", "lr": s.lr, "epochs": s.epochs,
                                                                    "minibatches": s.minibatches, "min_reward": s.min_reward,
                                                                    "seed": self.run.seed, **shared})


_ROLLOUT_FIELDS = frozenset(f.name for f in dataclasses.fields(RolloutConfig))


def _train_config(sdir, policy: Path, settings: dict[str, Any]) -> TrainConfig:
    """A TrainConfig over the folder's trees (a StepLayout: a step's or the cold start's), writing
    its checkpoint and train.jsonl, resuming an interrupted call and keeping a complete one."""
    return TrainConfig(trees=sdir.trees, rollouts=sdir.rollouts, model=policy, out=sdir.checkpoint, metrics=sdir.train_metrics,
                       resume=True, **settings)


_SECTIONS = {"run": RunSection, "model": ModelSection, "engine": EngineSection, "rollout": RolloutSection,
             "trees": TreesSection, "eval": EvalSection, "sft": SftSection, "offline": OfflineSection, "ray": RaySection,
             "log": LogSection}
# TrainConfig fields a recipe may not set: the loop fills them per step.
_TRAIN_FILLED = PER_CALL


_NOTICED: set[tuple[str, str]] = set()


def _old_name(where: str, old: str, new: str) -> None:
    """One notice a process for a renamed key's old spelling (RENAMED_KEYS): read this release, gone in the next."""
    if (where, old) not in _NOTICED:
        _NOTICED.add((where, old))
        STDERR.print(f"notice: {where}: '{old}' is now '{new}'; the old name is read for this release only", markup=False, highlight=False,
                     soft_wrap=True)


def _section(cls: type, table: dict, where: str, extra_ok: set[str] = frozenset(), renamed: dict[str, str] | None = None) -> Any:
    hints = typing.get_type_hints(cls)
    minimum = {f.name: f.metadata["minimum"] for f in dataclasses.fields(cls) if "minimum" in f.metadata}
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in table.items():
        if key in extra_ok:
            continue
        if renamed and key in renamed:
            if renamed[key] in table:
                raise UserError(f"{where}: give '{renamed[key]}' only ('{key}' is its old name)")
            _old_name(where, key, renamed[key])
            key = renamed[key]
        if key not in known:
            raise UserError(f"{where}: unknown key '{key}'{did_you_mean(key, [*known, *extra_ok])}; known: {', '.join(sorted(known))}")
        kwargs[key] = typed(value, hints[key], f"{where} key '{key}'")
        if key in minimum and kwargs[key] < minimum[key]:  # the same floor as the command line's option
            raise UserError(f"{where} key '{key}' must be >= {minimum[key]}, got {kwargs[key]}")
    return cls(**kwargs)


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """The recipe at `path`, with `overrides` ("train.lr=0.1", `apply_overrides`) set over its keys, validated."""
    path = Path(path).resolve()
    if not path.is_file():
        raise UserError(f"{path}: no such recipe file")
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid TOML ({e})") from None
    apply_overrides(doc, overrides)
    unknown = set(doc) - set(_SECTIONS) - {"train"}
    if unknown:
        name = sorted(unknown)[0]
        raise UserError(f"{path}: unknown section [{name}]{did_you_mean(name, [*_SECTIONS, 'train'])}; "
                        f"known: {', '.join(sorted([*_SECTIONS, 'train']))}")
    sections = {}
    for name, cls in _SECTIONS.items():
        table = doc.get(name, {})
        if not isinstance(table, dict):
            raise UserError(f"{path}: [{name}] must be a table")
        extra = set(HARNESS_NAMES) if name == "rollout" else set()
        if name == "engine":
            sections[name] = _engine_section(table, f"{path} [engine]")
            continue
        sections[name] = _section(cls, table, f"{path} [{name}]", extra, RENAMED_KEYS.get(name))
        if name == "rollout":
            sections[name].harness_options = {h: table[h] for h in HARNESS_NAMES if isinstance(table.get(h), dict)}
    train = doc.get("train", {})
    tc_fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    hints = typing.get_type_hints(TrainConfig)
    for key, value in train.items():
        if key in _TRAIN_FILLED or key not in tc_fields:
            allowed = sorted(set(tc_fields) - _TRAIN_FILLED)
            raise UserError(f"{path} [train]: unknown key '{key}'{did_you_mean(key, allowed)}; known: {', '.join(allowed)}")
        train[key] = typed(value, hints[key], f"{path} [train] key '{key}'")
    recipe = Recipe(path=path, train=train, **sections)
    _resolve_paths(recipe)
    _validate(recipe, HARNESS_NAMES)
    return recipe


def _field_type(section: str, key: str) -> Any:
    """The annotation of a recipe key (Any for engine options and harness options), or None when unknown."""
    if section == "train":
        return typing.get_type_hints(TrainConfig).get(key) if key not in _TRAIN_FILLED else None
    if section == "engine":
        return str if key in ("name", "tool_parser", "chat_template") else Any
    hints = typing.get_type_hints(_SECTIONS[section])
    return {**hints, **{old: hints[new] for old, new in RENAMED_KEYS.get(section, {}).items()}}.get(key)


def apply_overrides(doc: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> None:
    """Set each `SECTION.KEY=VALUE` (`rollout.agentloop.max_tokens=8` for a harness's option) in the
    recipe's TOML document, the value typed by the key's field; the usual checks then run on the result."""
    sections = [*_SECTIONS, "train"]
    for item in overrides:
        dotted, eq, text = item.partition("=")
        parts = dotted.strip().split(".")
        if not eq or len(parts) < 2 or not all(parts):
            raise UserError(f"override {item!r}: expected SECTION.KEY=VALUE (e.g. train.lr=0.1)")
        section, key = parts[0], parts[1]
        if section not in sections:
            raise UserError(f"override {item!r}: unknown section [{section}]{did_you_mean(section, sections)}; "
                            f"known: {', '.join(sorted(sections))}")
        table = doc.setdefault(section, {})
        renamed = RENAMED_KEYS.get(section, {})
        if key in renamed:  # an old name sets the field under its new one
            _old_name(f"override {item!r}", key, renamed[key])
            key = renamed[key]
        for old in [o for o, new in renamed.items() if new == key]:
            table.pop(old, None)  # the override wins over the file's old spelling of the same key
        if section == "rollout" and key in HARNESS_NAMES:
            if len(parts) != 3:
                raise UserError(f"override {item!r}: a harness option is rollout.{key}.KEY=VALUE")
            table.setdefault(key, {})[parts[2]] = from_text(text, Any)
            continue
        annotation = _field_type(section, key)
        if annotation is None or len(parts) > 2:
            known = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in _TRAIN_FILLED] if section == "train" else \
                [f.name for f in dataclasses.fields(_SECTIONS[section])] if section != "engine" else []
            raise UserError(f"override {item!r}: unknown key '{'.'.join(parts[1:])}' in [{section}]{did_you_mean(key, known)}"
                            + (f"; known: {', '.join(sorted(known))}" if known else ""))
        table[key] = from_text(text, annotation)


def _engine_section(table: dict, where: str) -> EngineSection:
    """[engine]: name, tool_parser and chat_template are the proxy's; every other key is an engine option."""
    known = [f.name for f in dataclasses.fields(EngineSection) if f.name != "options"]
    for key in known:
        if key in table and not isinstance(table[key], str):
            raise UserError(f"{where} key '{key}' must be str, got {type(table[key]).__name__} {table[key]!r}")
    section = EngineSection(**{k: table[k] for k in known if k in table}, options={k: v for k, v in table.items() if k not in known})
    try:
        section.tool_parser = check_name(section.tool_parser)
    except UserError as e:
        raise UserError(f"{where} key 'tool_parser': {e}") from None
    return section


def _resolve_paths(r: Recipe) -> None:
    base = r.path.parent
    for obj, attr in ((r.run, "dir"), (r.model, "path"), (r.rollout, "tasks"), (r.eval, "tasks"), (r.sft, "tasks"), (r.offline, "from_run")):
        value = getattr(obj, attr)
        if value is not None and not Path(value).is_absolute():
            setattr(obj, attr, (base / value).resolve())
    template = r.engine.chat_template
    if template is not None and template not in SHIPPED and not Path(template).is_absolute():
        r.engine.chat_template = str((base / template).resolve())


def _validate(r: Recipe, harnesses: tuple[str, ...]) -> None:
    where = str(r.path)
    if r.model.path is not None and r.model.init is not None or (r.model.path is None and r.model.init is None
                                                                   and r.offline.from_run is None):
        raise UserError(f"{where} [model]: give exactly one of 'path' (an HF model dir) or 'init' (tiny | small | a pretrained name)"
                        "; an [offline] recipe may give neither")
    if r.model.init is not None and r.model.init not in (*SIZES, *PRETRAINED):
        raise UserError(f"{where} [model] key 'init': unknown '{r.model.init}'; choose a size ({', '.join(SIZES)}) "
                        f"or a pretrained model ({', '.join(PRETRAINED)})")
    if r.engine.chat_template is not None:
        load_chat_template(r.engine.chat_template, f"{where} [engine] key 'chat_template':")  # a missing or unreadable file fails before any work
    if r.model.path is not None and not (r.model.path / "config.json").exists():
        raise UserError(f"{where} [model] key 'path': {r.model.path} is not a model directory (no config.json)")
    try:
        check_engine(r.engine.name, {})  # the name here; its options when the proxy starts the engine
    except UserError as e:
        raise UserError(f"{where} [engine] key 'name': {e}") from None
    if r.run.steps < 1:
        raise UserError(f"{where} [run] key 'steps' must be at least 1, got {r.run.steps}")
    if r.run.max_staleness and r.offline.from_run is not None:
        raise UserError(f"{where} [run] key 'max_staleness': an [offline] recipe collects no rollouts to overlap with "
                        f"training; leave it 0")
    if r.run.max_staleness and r.engine.name not in RELOADS_IN_PLACE:
        raise UserError(f"{where} [run] key 'max_staleness': the '{r.engine.name}' engine cannot take new weights while it "
                        f"serves, which an asynchronous run needs; use one of {', '.join(sorted(RELOADS_IN_PLACE))}, or 0")
    if r.run.keep_last < 0:
        raise UserError(f"{where} [run] key 'keep_last' must be 0 (keep all) or more, got {r.run.keep_last}")
    if r.offline.from_run is None:
        if r.rollout.tasks is None:
            raise UserError(f"{where} [rollout]: 'tasks' (a folder of task folders) is required")
        if not r.rollout.tasks.is_dir():
            raise UserError(f"{where} [rollout] key 'tasks': {r.rollout.tasks} is not a directory")
    elif not r.offline.from_run.is_dir():
        raise UserError(f"{where} [offline] key 'from_run': {r.offline.from_run} is not a run directory")
    _validate_sft(r, where)
    check_wandb_options(r.log.wandb, f"{where} [log]")
    for h in r.rollout.harnesses + r.eval.harnesses + r.sft.harnesses:
        if h not in harnesses:
            raise UserError(f"{where} [rollout] key 'harnesses': unknown harness '{h}'; choose from: {', '.join(harnesses)}")
    if not r.rollout.harnesses:
        raise UserError(f"{where} [rollout] key 'harnesses' must name at least one harness")


def _validate_sft(r: Recipe, where: str) -> None:
    s = r.sft
    if not s.demonstrations:
        return
    try:
        check_engine(s.engine, r.sft_engine_options())
    except UserError as e:
        raise UserError(f"{where} [sft]: {e}") from None
    for key in ("epochs", "minibatches"):
        if getattr(s, key) < 1:
            raise UserError(f"{where} [sft] key '{key}' must be at least 1, got {getattr(s, key)}")
    tasks = s.tasks or r.rollout.tasks
    if tasks is None or not tasks.is_dir():
        raise UserError(f"{where} [sft] key 'tasks': {tasks} is not a directory")


def recipe_to_toml(r: Recipe) -> str:
    """The resolved recipe as TOML (defaults filled, paths absolute), saved in the run directory."""
    def plain(d: dict) -> dict:  # paths as strings; unset keys left out
        return {k: str(v) if isinstance(v, Path) else v for k, v in d.items() if v is not None}

    rollout = dataclasses.asdict(r.rollout)
    harness_options = rollout.pop("harness_options")
    parser_set = r.engine.tool_parser != default_of(field_of(EngineSection, "tool_parser"))
    doc = {
        # keep_last only when set, so a run saved before the key existed still resumes with its recipe
        "run": plain({**{k: v for k, v in dataclasses.asdict(r.run).items() if k != "keep_last" or v}, "dir": r.run_dir}),
        "model": plain(dataclasses.asdict(r.model)),
        # tool_parser and chat_template only when set: a run saved before the keys existed still resumes with its recipe
        "engine": plain({"name": r.engine.name, **({"tool_parser": r.engine.tool_parser} if parser_set else {}),
                         **({"chat_template": r.engine.chat_template} if r.engine.chat_template is not None else {}),
                         **r.engine.options}),
        "rollout": {**plain(rollout), **{h: plain(o) for h, o in harness_options.items()}},
        "trees": plain(dataclasses.asdict(r.trees)),
        "train": plain(r.train),
        "eval": plain(dataclasses.asdict(r.eval)),
        # only a recipe with a cold start has the section, so runs started before it existed still resume
        **({"sft": plain(dataclasses.asdict(r.sft))} if r.sft.demonstrations else {}),
        "offline": plain(dataclasses.asdict(r.offline)),
        "ray": plain(dataclasses.asdict(r.ray)),
        # only a recipe that turns a sink on has the section, so runs started before it existed still resume
        **({"log": plain(dataclasses.asdict(r.log))} if r.log != LogSection() else {}),
    }
    return dump_toml(doc)


def reference_markdown() -> str:
    """The field tables of docs/config.md, made from the fields' own help (a test keeps the file equal to this)."""
    parts = []
    for name, cls in _SECTIONS.items():
        note = {"engine": " (`options` stands for every other key: they are the engine's options)",
                "rollout": " (and `[rollout.<harness>]` tables: that harness adapter's options; `timeout` is read as `timeout_s`)"}.get(name, "")
        parts.append(f"### [{name}]{note}\n\n{reference(cls)}")
    parts.append("### [train]\n\nEvery `clawgym train` option, by its field name (`clawgym train --help` shows the same help):\n\n"
                 + reference(TrainConfig, skip=_TRAIN_FILLED))
    parts.append("### `clawgym train` only\n\nThe loop fills these per step; a recipe may not set them.\n\n"
                 + reference(TrainConfig, skip={f.name for f in dataclasses.fields(TrainConfig)} - _TRAIN_FILLED))
    parts.append("### RolloutConfig (`clawgym rollout` and `clawgym eval`, rollout.config.json)\n\n"
                 "The rollout stage's whole config; the recipe's [rollout] keys are the ones above, the loop fills the rest. "
                 "Each field is an option of `clawgym rollout` and `clawgym eval` (their --help shows this help); "
                 "`verifier` is given by the options `--judge-url` and `--judge-model` (the [rollout] keys "
                 "`judge_url`, `judge_model`); `--script FILE` and `--max-context N` set the engine options `script` and "
                 "`max_context`; eval's and compare's `--samples-per-task` is `--group-size` with [eval] `samples_per_task`'s default.\n\n"
                 + reference(RolloutConfig, options=True, no_option={"verifier"}))
    parts.append("### ProxyConfig (`clawgym serve-proxy`)\n\n"
                 "The proxy's config; each field but those marked - is an option of `clawgym serve-proxy` (its --help shows "
                 "this help); `--engine-url URL` and `--script FILE` set the engine options `engine_url` and `script`. "
                 "`clawgym rollout` and `clawgym run` start the same proxy from their RolloutConfig (model, engine, engine_options, tool_parser, chat_template, proxy_host).\n\n"
                 + reference(ProxyConfig, options=True, no_option=SERVE_SKIP))
    return "\n\n".join(parts) + "\n"



GENERATED_MARK = "<!-- generated below: clawgym.run.recipe.reference_markdown() -->\n\n"


def write_reference(path: Path) -> None:
    """Rewrite the generated part of docs/config.md (below GENERATED_MARK) from the fields' help."""
    head = path.read_text(encoding="utf-8").split(GENERATED_MARK, 1)[0]
    path.write_text(head + GENERATED_MARK + reference_markdown(), encoding="utf-8")


if __name__ == "__main__":  # python -m clawgym.run.recipe docs/config.md: after adding or changing a field
    import sys

    write_reference(Path(sys.argv[1]))
