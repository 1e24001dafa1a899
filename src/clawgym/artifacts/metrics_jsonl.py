"""metrics.jsonl lines: a step and namespaced numbers, appended one line per step."""

from __future__ import annotations

import os
from dataclasses import dataclass

from clawgym.artifacts.jsonl import JsonlWriter, read_jsonl
from clawgym.artifacts.rows import ArtifactError

METRIC_PREFIXES = ("proxy/", "rollout/", "trees/", "train/", "eval/", "time/", "memory/")


@dataclass
class MetricsLine:
    """One line of metrics.jsonl: a step and namespaced numbers (proxy/ rollout/ trees/ train/ eval/)."""

    step: int
    values: dict[str, float]
    time: float = 0.0

    def __post_init__(self) -> None:
        for key in self.values:
            if not key.startswith(METRIC_PREFIXES):
                raise ValueError(f"metric '{key}' must start with one of {', '.join(METRIC_PREFIXES)}")

    def to_json(self) -> dict:
        return {"step": self.step, "time": self.time, **self.values}

    @classmethod
    def from_json(cls, rec: dict, path: str | os.PathLike = "<metrics>") -> "MetricsLine":
        if "step" not in rec:
            raise ArtifactError(path, "step", "missing in metrics line")
        values = {k: v for k, v in rec.items() if k not in ("step", "time")}
        try:
            return cls(int(rec["step"]), values, float(rec.get("time", 0.0)))
        except ValueError as e:
            raise ArtifactError(path, None, str(e)) from None


def append_metrics(path: str | os.PathLike, line: MetricsLine) -> None:
    with JsonlWriter(path) as w:
        w.append(line.to_json())


def read_metrics(path: str | os.PathLike) -> list[MetricsLine]:
    return [MetricsLine.from_json(r, path) for r in read_jsonl(path).records]
