"""TrainConfig.validate refuses bad settings in one line without importing torch; UpdateStats' fields are the train/ metric names."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from clawgym.errors import UserError
from clawgym.train.config import TrainConfig


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(trees=Path("t.parquet"), rollouts=Path("r.parquet"), model=Path("m"), out=Path("o"), **kw)


@pytest.mark.parametrize("kw, message", [
    (dict(algo="dpo"), "--algo must be one of grpo, ppo, sft, got 'dpo'"),
    (dict(tis="always"), "--tis must be one of token, sequence, off"),
    (dict(aggregation="sum"), "--aggregation must be one of token-mean, rollout-mean"),
    (dict(precision="fp8"), "--precision must be one of fp32, bf16"),
    (dict(attention="flash"), "--attention must be one of auto, segments, dense, flex"),
    (dict(minibatches=0), "--minibatches must be at least 1"),
    (dict(token_budget=0), "--token-budget must be at least 1"),
    (dict(head_chunk=-1), "--head-chunk must be 0"),
    (dict(kl_coef=0.1), "--kl-coef > 0 needs --ref-model"),
    (dict(lora_rank=-2), "--lora-rank must be 0"),
    (dict(lora_rank=4, lora_alpha=0.0), "--lora-alpha must be positive"),
    (dict(lora_rank=4, lora_targets=" , "), "--lora-targets must name modules"),
    (dict(fsdp=True), "--fsdp shards across ranks"),
    (dict(fsdp=True, processes=2, lora_rank=4), "--fsdp with --lora-rank is not supported"),
    (dict(processes=0), "--processes must be at least 1"),
])
def test_a_bad_setting_is_one_line_naming_it(kw, message, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace("+", r"\+")) as e:
        _cfg(**kw).validate()
    assert "\n" not in str(e.value)


def test_validation_runs_without_torch():
    """A recipe loader can call it at load: neither a good nor a refused config imports torch."""
    code = ("import sys; from pathlib import Path; from clawgym.errors import UserError; "
            "from clawgym.train.config import TrainConfig\n"
            "c = lambda **kw: TrainConfig(trees=Path('t'), rollouts=Path('r'), model=Path('m'), out=Path('o'), **kw)\n"
            "c(algo='ppo', lora_rank=8, attention='flex', precision='bf16').validate()\n"
            "try:\n    c(algo='nope').validate()\nexcept UserError as e:\n    print(e)\n"
            "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["--algo must be one of grpo, ppo, sft, got 'nope'", "[]"]


def test_every_update_stat_is_a_train_metric_with_a_reduction_and_back():
    from clawgym.train.step_metrics import REDUCTIONS
    from clawgym.train.update import SkippedStats, UpdateStats

    names = {f"train/{f.name}" for cls in (UpdateStats, SkippedStats) for f in dataclasses.fields(cls)}
    assert names <= set(REDUCTIONS)
    assert set(REDUCTIONS) - names == {"train/grad_norm_max"}  # made from train/grad_norm when a step is reduced
