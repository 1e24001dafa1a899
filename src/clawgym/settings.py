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
from clawgym.layout import StepLayout

IGNORED = {
    "rollout": {"out", "concurrency", "proxy_url", "admin_token", "records", "settle_timeout_s", "ray", "ray_num_cpus", "proxy_host"},
    "build-trees": {"out", "metrics", "calls", "rollouts"},  # the inputs are the step folder's own files, wherever it lies
    "train": {"out", "metrics", "resume", "force", "processes", "accelerate_config"},
}
"""per stage, the config keys that do not shape its output (paths it writes to, parallelism, where the
proxy runs); every other key of the recorded config is compared"""
GROWS = ("harnesses", "group_size")
"""rollout keys an evaluation's rerun (`eval`, each policy of `compare`) may extend: more harnesses
(the recorded ones and others) or a larger group keep the rollouts already scored and run only the new
ones, since a rollout's id is its task, harness and sample index. A training step's rollouts never
grow: its trees and update were made from the ones it has."""
RENAMED = {"rollout": {"n": "group_size"}}
"""per stage, keys a record written by an older clawgym holds under their old name: compared under the new one"""
DERIVED = {"build-trees": {"step"}}
"""per stage, the keys it derives from its inputs when not given (build-trees reads the step from the
rollouts): compared only when a rerun gives them"""


def fingerprints(config: Any) -> dict[str, str]:
    """What a rollout stage's record holds beyond its settings, so that a rerun over changed inputs at
    the same paths is not taken for a resume: a hash of the task folder's contents, and of the
    model's config and tokenizer files with the names, sizes and modification times of its weight
    files (hashing gigabytes of weights on every rerun would cost more than it guards)."""
    import hashlib

    out = {}
    tasks = getattr(config, "tasks", None)
    if tasks is not None and Path(tasks).is_dir():
        h = hashlib.blake2b(digest_size=16)
        for f in sorted(p for p in Path(tasks).rglob("*") if p.is_file()):
            h.update(f.relative_to(tasks).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
        out["tasks_fingerprint"] = h.hexdigest()
    model = getattr(config, "model", None)
    if model is not None and Path(model).is_dir():
        h = hashlib.blake2b(digest_size=16)
        for f in sorted(p for p in Path(model).iterdir() if p.is_file()):
            st = f.stat()
            small = f.suffix in (".json", ".jinja", ".txt", ".model") and st.st_size < 64 << 20
            h.update(f.name.encode() + b"\0" + (f.read_bytes() if small else f"{st.st_size}:{st.st_mtime_ns}".encode()) + b"\0")
        out["model_fingerprint"] = h.hexdigest()
    return out


def _plain(config: Any) -> dict[str, Any]:
    """The config as its record holds it: JSON values, secrets redacted, paths resolved."""
    values = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    values = {k: str(Path(v).resolve()) if isinstance(v, PurePath) else v for k, v in values.items()}
    return orjson.loads(orjson.dumps(redact(values), default=str))


def grown(key: str, old: Any, new: Any) -> bool:
    """Whether `new` extends `old` under the GROWS rule: a list that keeps every old item, a larger count."""
    if key == "harnesses":
        return isinstance(old, list) and isinstance(new, list) and set(old) < set(new)
    return isinstance(old, int) and isinstance(new, int) and new > old


def differences(stage: str, recorded: dict[str, Any], config: Any, grows: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """"key: old → new" for each shaping key whose value differs (keys the record lacks are not compared),
    as two lists: the keys of `grows` whose new value extends the recorded one (`grown`), and the rest."""
    new = {**_plain(config), **(fingerprints(config) if stage == "rollout" else {})}
    recorded = {RENAMED.get(stage, {}).get(k, k): v for k, v in recorded.items()}
    differ, extend = [], []
    for key in sorted(set(new) & set(recorded) - IGNORED[stage]):
        if new[key] is None and key in DERIVED.get(stage, ()):
            continue
        old = recorded[key]
        if isinstance(new[key], str) and isinstance(old, str) and isinstance(getattr(config, key, None), PurePath):
            old = str(Path(old).resolve())  # a path recorded relative, compared resolved
        if key.endswith("_fingerprint") and old != new[key]:
            differ.append(f"{key.removesuffix('_fingerprint')}: its contents changed since")
            continue
        if old != new[key]:
            (extend if key in grows and grown(key, old, new[key]) else differ).append(f"{key}: {_short(old)} → {_short(new[key])}")
    return differ, extend


def _short(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def check_rerun(stage: str, record: Path, config: Any, *, force: bool, what: str, grows: tuple[str, ...] = ()) -> list[str] | None:
    """Compare a rerun's `config` with the `record` its output was made with. Returns None for a first
    run (no record) or a forced one; for a same-settings rerun, the keys of `grows` it extends
    ("key: old → new", empty when none; the caller resumes and says so); raises a one-line UserError
    naming the differing keys otherwise. `what` names the output."""
    if force or not record.is_file():
        return None
    try:
        recorded = orjson.loads(record.read_bytes())
    except orjson.JSONDecodeError:
        return None  # an unreadable record (cut short) says nothing: the stage decides as before
    diffs, extended = differences(stage, recorded, config, grows)
    if not diffs:
        return extended
    raise UserError(f"{what} was made with other settings ({'; '.join(diffs)}): rerun with the same settings to resume, "
                    f"or pass --force to start over")


def rollout_rerun(cfg: Any, *, force: bool, console: Any, evaluation: bool = False) -> None:
    """The rerun rule of a folder of rollouts (`clawgym rollout`, `eval`, each policy of `compare`): the
    same settings resume and say so, others are refused (`check_rerun`), `force` removes the folder's
    rollout outputs and the trees made from them first. An `evaluation` may also grow (`GROWS`)."""
    import shutil


    out = StepLayout(cfg.out)
    if evaluation and out.trees.exists():
        # growing a training step's rollouts would leave its trees, and what `train` makes of them, stale
        raise UserError(f"--out {cfg.out} is a training step (it holds trees.parquet): evaluate into a folder of its own "
                        f"(e.g. {Path(cfg.out) / 'eval'})")
    added = check_rerun("rollout", out.rollout_config, cfg, force=force, what=str(cfg.out), grows=GROWS if evaluation else ())
    if added is not None:
        more = f"; adding the rollouts of {'; '.join(added)}" if added else ""
        console.print(f"{cfg.out}: same settings as its rollouts; resuming (finished rollouts kept{more})", highlight=False,
                      soft_wrap=True, markup=False)
    elif force:
        for path in (out.results, out.transcripts, out.rollouts, out.calls, out.rollout_config, out.trees, out.trees_config):
            path.unlink(missing_ok=True)
        shutil.rmtree(out.records, ignore_errors=True)
