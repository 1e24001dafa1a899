"""The train–inference mismatch measurement: its statistics, its selection of calls, and `clawgym mismatch`
on calls sampled by the hf engine (fp32 on both sides: the mismatch must be tiny)."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys

import pytest

from clawgym.artifacts import CallRecord, write_table
from clawgym.engines import EngineConfig, Sampling, make_engine
from clawgym.errors import UserError
from clawgym.run.mismatch import load_policy, measure, token_stats, trainer_logprobs


def call(i: int, prompt: list[int], out: list[int], lps: list[float], version: int = 0, **kw) -> CallRecord:
    return CallRecord(rollout_id=f"r{i}", call_id=f"c{i}", seq=0, protocol="direct", model="tiny", started_at=float(i),
                      finished_at=float(i), prompt_ids=prompt, output_ids=out, output_logprobs=lps, finish_reason="stop",
                      policy_version=version, **kw)


def test_token_stats_known_values():
    engine = [-1.0, -1.0, -2.0, -0.5]
    trainer = [-1.0, -1.0 + math.log(3.0), -2.1, -0.5]  # ratios 1, 3, e^-0.1, 1
    mean_abs, max_abs, k3, outside = token_stats(engine, trainer)
    assert mean_abs == pytest.approx((math.log(3.0) + 0.1) / 4)
    assert max_abs == pytest.approx(math.log(3.0))
    assert k3 == pytest.approx(((3 - math.log(3.0) - 1) + (math.exp(-0.1) + 0.1 - 1)) / 4)
    assert outside == 0.25
    assert token_stats([], []) == (0.0, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        token_stats([-1.0], [])


@pytest.fixture(scope="module")
def hf_calls(tiny_model, tmp_path_factory):
    """calls.parquet with real hf-engine samples (temperature 1), plus one failed call that must be skipped."""
    async def go():
        engine = make_engine("hf", EngineConfig(tiny_model, {"max_batch": 4}))
        try:
            return await asyncio.gather(*(engine.generate([10 + i, 11, 12, 13] * (i + 2), Sampling(max_tokens=12, seed=i), f"r{i}")
                                          for i in range(4)))
        finally:
            await engine.close()

    gens = asyncio.run(go())
    rows = [call(i, [10 + i, 11, 12, 13] * (i + 2), g.output_ids, g.output_logprobs, sampling_json='{"temperature": 1.0}')
            for i, g in enumerate(gens)]
    rows.append(call(9, [1, 2], [], [], status="engine_error", error="overloaded"))
    path = tmp_path_factory.mktemp("mismatch") / "hf" / "calls.parquet"
    path.parent.mkdir()
    write_table(path, rows, CallRecord)
    return path


def test_hf_engine_mismatch_is_tiny(hf_calls, tiny_model):
    m = measure(hf_calls, load_policy(tiny_model))
    assert (m.label, m.calls, m.policy_version, m.hot_calls) == ("hf", 4, 0, 0)
    assert m.tokens == 48 and m.mean_abs < 1e-4 and m.outside == 0.0


def test_trainer_logprobs_see_the_engine_drift(tiny_model):
    model = load_policy(tiny_model)
    lp = trainer_logprobs(model, [5, 6, 7], [8, 9])
    assert len(lp) == 2 and all(x < 0 for x in lp)
    shifted = [x + 1.0 for x in lp]  # an engine 1 nat more confident on every token: ratio e^-1 < 0.5
    assert token_stats(shifted, lp)[3] == 1.0
    assert trainer_logprobs(model, [5], []) == []


def test_selection_errors(tiny_model, tmp_path):
    model = load_policy(tiny_model)
    mixed = tmp_path / "mixed.parquet"
    write_table(mixed, [call(0, [5, 6], [7], [-7.6], 0), call(1, [5, 6], [7], [-7.6], 1)], CallRecord)
    with pytest.raises(UserError, match="mixes policy versions 0 .1 calls., 1 .1 calls.*--policy-version"):
        measure(mixed, model)
    assert measure(mixed, model, policy_version=1).calls == 1
    with pytest.raises(UserError, match="no call of policy version 7"):
        measure(mixed, model, policy_version=7)
    empty = tmp_path / "empty.parquet"
    write_table(empty, [call(0, [5], [], [], status="engine_error")], CallRecord)
    with pytest.raises(UserError, match="no successful call"):
        measure(empty, model)
    with pytest.raises(UserError, match="does not exist"):
        measure(tmp_path / "nope.parquet", model)


@pytest.mark.slow
def test_cli_prints_the_table(hf_calls, tiny_model):
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")
    out = subprocess.run([sys.executable, "-m", "clawgym.cli", "mismatch", "--calls", str(hf_calls), "--model", str(tiny_model)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "mean |Δlogp|" in out.stdout and "k3 KL" in out.stdout
    row = next(line for line in out.stdout.splitlines() if line.strip("│ ").startswith("hf"))
    assert " 48 " in row and "0.00%" in row
    bad = subprocess.run([sys.executable, "-m", "clawgym.cli", "mismatch", "--calls", str(hf_calls) + ".missing",
                          "--model", str(tiny_model)], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 1 and "does not exist" in bad.stderr
