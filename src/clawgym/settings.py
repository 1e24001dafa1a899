"""Stage reruns: the settings that shape a stage's output, compared with those its output was made with.

Every stage records its resolved config next to its output (rollout.config.json, trees.config.json,
CHECKPOINT/train_config.json; `artifacts.write_config`). A rerun into the same output compares the
keys of that record that shape the output (`SHAPING`: everything but where files go and how fast the
work runs) with its own: the same settings resume (the stage keeps what is done and says so in one
line), different ones are refused in one line naming each differing key, unless `--force` starts
over (docs/recipes.md, "Reruns").
"""

from __future__ import annotations

import dataclasses
from pathlib import Path, PurePath
from typing import Any

import orjson

from clawgym.artifacts import redact
from clawgym.errors import UserError

IGNORED = {
    "rollout": {"out", "concurrency", "proxy_url", "admin_token", "records", "settle_timeout_s", "ray", "ray_num_cpus", "proxy_host"},
    "build-trees": {"out", "metrics", "calls", "rollouts"},  # the inputs are the step folder's own files, wherever it lies
    "train": {"out", "metrics", "resume", "force", "processes", "accelerate_config"},
}
"""per stage, the config keys that do not shape its output (paths it writes to, parallelism, where the
proxy runs); every other key of the recorded config is compared"""
DERIVED = {"build-trees": {"step"}}
"""per stage, the keys it derives from its inputs when not given (build-trees reads the step from the
rollouts): compared only when a rerun gives them"""


def _plain(config: Any) -> dict[str, Any]:
    """The config as its record holds it: JSON values, secrets redacted, paths resolved."""
    values = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    values = {k: str(Path(v).resolve()) if isinstance(v, PurePath) else v for k, v in values.items()}
    return orjson.loads(orjson.dumps(redact(values), default=str))


def differences(stage: str, recorded: dict[str, Any], config: Any) -> list[str]:
    """"key: old → new" for each shaping key whose value differs (keys the record lacks are not compared)."""
    new = _plain(config)
    out = []
    for key in sorted(set(new) & set(recorded) - IGNORED[stage]):
        if new[key] is None and key in DERIVED.get(stage, ()):
            continue
        old = recorded[key]
        if isinstance(new[key], str) and isinstance(old, str) and isinstance(getattr(config, key, None), PurePath):
            old = str(Path(old).resolve())  # a path recorded relative, compared resolved
        if old != new[key]:
            out.append(f"{key}: {_short(old)} → {_short(new[key])}")
    return out


def _short(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def check_rerun(stage: str, record: Path, config: Any, *, force: bool, what: str) -> bool:
    """Compare a rerun's `config` with the `record` its output was made with. Returns False for a first
    run (no record) or a forced one, True for a same-settings rerun (the caller resumes and says so);
    raises a one-line UserError naming the differing keys otherwise. `what` names the output."""
    if force or not record.is_file():
        return False
    try:
        recorded = orjson.loads(record.read_bytes())
    except orjson.JSONDecodeError:
        return False  # an unreadable record (cut short) says nothing: the stage decides as before
    diffs = differences(stage, recorded, config)
    if not diffs:
        return True
    raise UserError(f"{what} was made with other settings ({'; '.join(diffs)}): rerun with the same settings to resume, "
                    f"or pass --force to start over")


def rollout_rerun(cfg: Any, *, force: bool, console: Any) -> None:
    """The rerun rule of a folder of rollouts (`clawgym rollout`, `eval`, each policy of `compare`): the
    same settings resume and say so, others are refused (`check_rerun`), `force` removes the folder's
    rollout outputs and the trees made from them first."""
    import shutil

    from clawgym.layout import StepLayout

    out = StepLayout(cfg.out)
    if check_rerun("rollout", out.rollout_config, cfg, force=force, what=str(cfg.out)):
        console.print(f"{cfg.out}: same settings as its rollouts; resuming (finished rollouts kept)", highlight=False,
                      soft_wrap=True, markup=False)
    elif force:
        for path in (out.results, out.transcripts, out.rollouts, out.calls, out.rollout_config, out.trees, out.trees_config):
            path.unlink(missing_ok=True)
        shutil.rmtree(out.records, ignore_errors=True)
