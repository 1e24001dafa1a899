"""What `clawgym run` checks after loading a recipe and before it writes anything: the harness options
(by building each adapter), the [train] values `train` would refuse (its own torch-free
`TrainConfig.validate`), the optional packages the recipe needs, and the task folders. Kept apart from
`config.load_recipe`, which imports neither the harness adapters nor the task loader, so reading and
writing a recipe stays light."""

from __future__ import annotations

from clawgym.errors import UserError, did_you_mean
from clawgym.rollout.harnesses import HARNESSES
from clawgym.run.recipe import Recipe
from clawgym.tasks.spec import find_task_dirs
from clawgym.train.config import AGGREGATIONS, ALGOS, ATTENTIONS, PRECISIONS, TIS_MODES


def check_runnable(r: Recipe) -> None:
    """Refuse, in one line naming the section and key, a loaded recipe `clawgym run` could not run."""
    where = str(r.path)
    _harness_options(r, where)
    _train(r, where)
    _extras(r, where)
    _tasks(r)


def _tasks(r: Recipe) -> None:
    """The task folders hold tasks (load_recipe checks only that the folders exist)."""
    named = [("rollout", r.rollout.tasks if r.offline.from_run is None else None), ("eval", r.eval.tasks), ("sft", r.sft.tasks)]
    for section, tasks in named:
        if tasks is not None:
            try:
                find_task_dirs(tasks)
            except UserError as e:
                raise UserError(f"{r.path} [{section}] key 'tasks': {e}") from None


def _harness_options(r: Recipe, where: str) -> None:
    """Build each [rollout.<harness>] table's adapter once, so a mistyped option or a bad value fails
    at load with its section named, not at the first rollout."""
    import inspect


    for name, options in r.rollout.harness_options.items():
        known = [p for p in inspect.signature(HARNESSES[name]).parameters if p not in ("self", "args", "kwargs")]
        for key in options:
            if key not in known:
                raise UserError(f"{where} [rollout.{name}]: unknown key '{key}'{did_you_mean(key, known)}; "
                                f"known: {', '.join(sorted(known))}")
        try:
            HARNESSES[name](**options)
        except (TypeError, ValueError, UserError) as e:
            raise UserError(f"{where} [rollout.{name}]: {e}") from None


# [train] keys with a fixed set of values, named with a did-you-mean at load (train/config.py owns the sets)
_TRAIN_CHOICES = {"algo": ALGOS, "precision": PRECISIONS, "tis": TIS_MODES, "aggregation": AGGREGATIONS,
                  "attention": ("auto", *ATTENTIONS)}


def _train(r: Recipe, where: str) -> None:
    """The [train] values `clawgym train` would refuse, refused at load (before the cold start and a step of rollouts)."""
    t, resolved = r.train, r.train_settings()
    for key, choices in _TRAIN_CHOICES.items():
        if key in t:
            if t[key] not in choices:
                raise UserError(f"{where} [train] key '{key}': unknown '{t[key]}'{did_you_mean(t[key], choices)}; "
                                f"choose one of: {', '.join(choices)}")
    for key in ("epochs", "minibatches", "token_budget", "processes"):
        if key in t and t[key] < 1:
            raise UserError(f"{where} [train] key '{key}' must be at least 1, got {t[key]}")
    if resolved["kl_coef"] > 0 and resolved["ref_model"] is None:
        raise UserError(f"{where} [train] key 'kl_coef' > 0 needs 'ref_model' (the policy to stay close to)")
    if resolved["lora_rank"] < 0:
        raise UserError(f"{where} [train] key 'lora_rank' must be 0 (full fine-tuning) or positive, got {t['lora_rank']}")
    try:  # the rest of what `train` refuses, by its own torch-free check (train/config.py)
        r.planned_train_config().validate()
    except UserError as e:
        raise UserError(f"{where} [train]: {e}") from None


def _extras(r: Recipe, where: str) -> None:
    """An optional package the recipe needs is named with its extra at load, before the run directory is written."""
    from importlib.util import find_spec

    needs = [("train", "lora_rank", "peft", "lora", r.train_settings()["lora_rank"] > 0),
             ("log", "tensorboard", "tensorboard", "tensorboard", r.log.tensorboard),
             ("log", "wandb", "wandb", "wandb", bool(r.log.wandb)),
             ("ray", "address", "ray", "ray", r.ray.address is not None),
             ("rollout", "sandbox", "docker", "docker", r.rollout.sandbox == "docker")]
    for section, key, package, extra, needed in needs:
        if needed and find_spec(package) is None:
            raise UserError(f"{where} [{section}] key '{key}' needs the {package} package: pip install 'clawgym[{extra}]'")
