"""A small soak of the proxy (the full one is `bench/soak.py`): correctness under concurrency, not timing.

50 concurrent rollouts x 8 streaming calls with the official openai async client against a
`clawgym serve-proxy` process: no errors, exactly one record per call (none lost, none duplicated,
seq 0..7 per rollout), and the proxy's RSS in the last quarter of the run within a generous bound of
the first quarter (a leak proportional to calls would show; allocator noise would not).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "soak.py"


def _soak_module():
    spec = importlib.util.spec_from_file_location("clawgym_bench_soak", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_soak_no_errors_exact_records_bounded_memory(tiny_model: Path, tmp_path: Path) -> None:
    soak = _soak_module()
    rollouts, calls = 50, 8
    out = soak.soak(tiny_model, rollouts, calls, baseline=False, sample_every=0.1, workdir=tmp_path)
    res = out["proxy"]
    assert res.errors == []
    assert res.calls == rollouts * calls
    assert out["record_problems"] == []
    assert out["records"] == rollouts * calls
    first, last, peak = res.rss_quarters()
    assert len(res.rss) >= 4, "too few RSS samples to judge"
    # Generous: the model-free proxy holds per-rollout render state; growth past +50% (or +150 MiB) means a leak.
    assert last <= max(first * 1.5, first + 150), (first, last, peak)


def test_record_checker_finds_lost_and_duplicated_records(tmp_path: Path) -> None:
    """The soak's own checker can fail: a missing record, a duplicate and a stray file are reported."""
    import orjson

    soak = _soak_module()
    rec = {"rollout_id": "a", "call_id": "c0", "seq": 0, "protocol": "openai-chat", "model": "m", "started_at": 0.0,
           "finished_at": 0.0, "prompt_ids": [1], "output_ids": [2], "output_logprobs": [0.0], "finish_reason": "stop",
           "policy_version": 0}
    (tmp_path / "a.jsonl").write_bytes(orjson.dumps(rec) + b"\n" + orjson.dumps(rec | {"seq": 1}) + b"\n")  # dup call id
    (tmp_path / "b.jsonl").write_bytes(orjson.dumps(rec | {"rollout_id": "b"}) + b"\n")                      # one lost
    (tmp_path / "stray.jsonl").write_bytes(b"")
    problems = soak.check_records(tmp_path, ["a", "b"], 2)
    assert any("duplicated" in p for p in problems)
    assert any(p.startswith("b:") and "seqs" in p for p in problems)
    assert any("unexpected files" in p for p in problems)
