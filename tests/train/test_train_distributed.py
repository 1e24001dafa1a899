"""Data-parallel and FSDP `train` on CPU with gloo: 2 ranks = 1 rank on uneven shards, a dead rank fails cleanly and resumes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from clawgym.artifacts import RolloutRecord, TreeNode, read_metrics, write_table
from clawgym.errors import UserError
from clawgym.train import checkpoint as ckpt
from clawgym.train.distributed import launch_command, padded_plan, shard, write_spec
from clawgym.train.packing import plan_microbatches
from clawgym.train.config import TrainConfig
from clawgym.train.loop import train

# An 80-token prompt: one process forwards it once per step (prefix.py), two fall back to once per micro-batch.
PROMPT = list(range(40, 120))
TOOL = list(range(300, 310))
# Answers of very different lengths, so the shards and their micro-batch counts differ between ranks.
ANSWERS = [list(range(100, 100 + n)) for n in (3, 40, 6, 90, 12)]
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.5]


def _tree(rid: str, answer: list[int]) -> list[TreeNode]:
    a = len(PROMPT)
    return [
        TreeNode(rid, 0, -1, PROMPT, "env", [], "c0", 0, "main", True, 0),
        TreeNode(rid, 1, 0, answer, "model", [-9.0] * len(answer), "c0", 0, "main", True, a),
        TreeNode(rid, 2, 1, TOOL, "env", [], "c1", 0, "main", True, a + len(answer)),
        TreeNode(rid, 3, 2, answer[:5], "model", [-8.0] * len(answer[:5]), "c1", 0, "main", True, a + len(answer) + len(TOOL)),
    ]


@pytest.fixture
def uneven(tmp_path: Path) -> Path:
    d = tmp_path / "step"
    nodes, rows = [], []
    for i, (ans, r) in enumerate(zip(ANSWERS, REWARDS)):
        nodes += _tree(f"r{i}", ans)
        rows.append(RolloutRecord(f"r{i}", "t1", "agentloop", "t1+agentloop", 0, "ok", r, 2, 1.0, 0))
    write_table(d / "trees.parquet", nodes, TreeNode)
    write_table(d / "rollouts.parquet", rows, RolloutRecord)
    return d


def _cfg(step: Path, model: Path, out: Path, **kw) -> TrainConfig:
    # A budget below the longest tree: ranks get different numbers of micro-batches per minibatch.
    # Head chunks of 4 tokens: the chunked LM head recomputes several chunks under DDP and FSDP.
    base = dict(lr=1e-4, epochs=2, minibatches=2, token_budget=160, head_chunk=4, metrics=out.parent / f"{out.name}.jsonl")
    return TrainConfig(trees=step / "trees.parquet", rollouts=step / "rollouts.parquet", model=model, out=out, **{**base, **kw})


def _max_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(a), load_file(b)
    assert x.keys() == y.keys()
    return max(float((x[k].float() - y[k].float()).abs().max()) for k in x)


def test_shards_balance_tokens_longest_first_and_plans_pad_to_the_same_length():
    owner = shard([10, 50, 20, 40, 5], 2)
    # 50 → r0; 40 → r1 (lighter); 20 → r1 (40 < 50); 10 → r0 (50 < 60); 5 → r0 (60 = 60: lowest rank)
    assert owner == [0, 0, 1, 1, 0]
    sizes = [10, 50, 20, 40, 5]
    loads = [sum(s for s, o in zip(sizes, owner) if o == r) for r in range(2)]
    assert abs(loads[0] - loads[1]) <= max(sizes)
    def planner(mine):
        return [[mine[k] for k in mb] for mb in plan_microbatches([sizes[i] for i in mine], 60)]

    plans = [padded_plan([0, 1, 2, 3, 4], owner, r, 2, planner) for r in range(2)]
    assert len(plans[0]) == len(plans[1])
    real = sorted(i for p in plans for mb in p if mb is not None for i in mb)
    assert real == [0, 1, 2, 3, 4]  # every tree once, on its owner
    assert all(owner[i] == r for r, p in enumerate(plans) for mb in p if mb for i in mb)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_two_processes_update_the_weights_as_one_does(uneven, tiny_model, tmp_path, algo, capsys):
    kw = dict(algo=algo, value_warmup_steps=1) if algo == "ppo" else dict(algo=algo)
    one, two = tmp_path / "one", tmp_path / "two"
    train(_cfg(uneven, tiny_model, one, **kw))
    res = train(_cfg(uneven, tiny_model, two, processes=2, **kw))
    assert res.updates == 4 and ckpt.load_state(two).complete
    diff = _max_diff(one / "model.safetensors", two / "model.safetensors")
    moved = _max_diff(tiny_model / "model.safetensors", one / "model.safetensors")
    with capsys.disabled():
        print(f"\n{algo}: max |w(1 process) − w(2 processes)| = {diff:.2e} (the update itself moved weights by up to {moved:.2e})")
    assert moved > 1e-4 and diff < 1e-5
    if algo == "ppo":
        assert _max_diff(one / "value" / "model.safetensors", two / "value" / "model.safetensors") < 1e-5
    # Rank 0 alone wrote the metrics: one line per update, summed over both ranks' trees.
    lines_one, lines_two = read_metrics(tmp_path / "one.jsonl"), read_metrics(tmp_path / "two.jsonl")
    assert len(lines_one) == len(lines_two) == 4
    for a, b in zip(lines_one, lines_two):
        va, vb = a.values, b.values
        assert (va["train/processes"], vb["train/processes"]) == (1, 2)
        for k in ("train/loss", "train/entropy", "train/trainable_tokens", "train/grad_norm"):
            assert vb[k] == pytest.approx(va[k], rel=1e-4, abs=1e-6), k
        # The prompt is forwarded once for both ranks (prefix.py); tries still form within a rank only, so
        # tokens the trees share after it may be forwarded once per rank.
        assert va["train/tokens_forwarded"] <= vb["train/tokens_forwarded"] < va["train/tokens_forwarded"] + len(PROMPT)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_fsdp_on_two_processes_shards_the_weights_and_updates_them_as_one_process_does(uneven, tiny_model, tmp_path,
                                                                                       algo, capsys):
    kw = dict(algo=algo, value_warmup_steps=1) if algo == "ppo" else dict(algo=algo)
    one, two = tmp_path / "one", tmp_path / "two"
    train(_cfg(uneven, tiny_model, one, **kw))
    train(_cfg(uneven, tiny_model, two, processes=2, fsdp=True, **kw))
    assert ckpt.load_state(two).complete
    diff = _max_diff(one / "model.safetensors", two / "model.safetensors")  # same keys: the tied head once
    moved = _max_diff(tiny_model / "model.safetensors", one / "model.safetensors")
    line = read_metrics(tmp_path / "two.jsonl")[-1].values
    held, total = line["train/params_per_rank"], line["train/params"]
    with capsys.disabled():
        print(f"\nFSDP {algo}: max |w(1 process) − w(2 FSDP processes)| = {diff:.2e} (update moved up to {moved:.2e}); "
              f"largest rank holds {held:.0f} of {total:.0f} parameter elements")
    assert moved > 1e-4 and diff < 1e-5
    # Each rank holds half of every parameter (rounded up per parameter), not the whole model.
    assert read_metrics(tmp_path / "one.jsonl")[-1].values["train/params_per_rank"] == total
    assert total / 2 <= held < total / 2 + 0.01 * total
    # The checkpoint has the unsharded format: the optimizer state keyed by parameter index, whole tensors.
    dirs = [""] + (["value"] if algo == "ppo" else [])
    for d in dirs:
        a, b = (torch.load(x / d / ckpt.OPTIMIZER_FILE, weights_only=True) for x in (one, two))
        assert a["param_groups"][0]["params"] == b["param_groups"][0]["params"] and a["state"].keys() == b["state"].keys()
        for i, st in a["state"].items():
            for k, v in st.items():
                assert b["state"][i][k].shape == v.shape and torch.allclose(b["state"][i][k], v, atol=1e-5), (d, i, k)
    if algo == "ppo":
        assert _max_diff(one / "value" / "model.safetensors", two / "value" / "model.safetensors") < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_a_rank_killed_mid_step_fails_the_step_and_resume_completes_it(uneven, tiny_model, tmp_path, fsdp):
    whole, part = tmp_path / "whole", tmp_path / "part"
    train(_cfg(uneven, tiny_model, whole))
    spec = tmp_path / "spec.json"
    write_spec(_cfg(uneven, tiny_model, part, fsdp=fsdp), spec)
    worker = Path(__file__).parent / "dist_kill_worker.py"
    # Rank 1 dies in its 3rd optimizer step (epoch 2's first update): rank 0 is blocked in a collective.
    proc = subprocess.run(launch_command(2) + [str(worker), str(spec), "1", "3"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    state = ckpt.load_state(part)
    assert state is not None and not state.complete and state.epochs_done == 1
    # Under FSDP the resumed ranks each take their shard of the saved (whole) optimizer state.
    train(_cfg(uneven, tiny_model, part, processes=2, resume=True, fsdp=fsdp))
    assert ckpt.load_state(part).complete
    assert _max_diff(whole / "model.safetensors", part / "model.safetensors") < 1e-5


def test_bad_process_counts_are_one_line_errors(uneven, tiny_model, tmp_path):
    with pytest.raises(UserError, match="--processes must be at least 1"):
        train(_cfg(uneven, tiny_model, tmp_path / "o", processes=0))
    with pytest.raises(UserError, match="--precision must be one of"):
        train(_cfg(uneven, tiny_model, tmp_path / "o", precision="fp8"))
    with pytest.raises(UserError, match="--fsdp shards across ranks"):
        train(_cfg(uneven, tiny_model, tmp_path / "o", fsdp=True))
    with pytest.raises(UserError, match="--fsdp with --lora-rank is not supported"):
        train(_cfg(uneven, tiny_model, tmp_path / "o", processes=2, fsdp=True, lora_rank=4))
    with pytest.raises(UserError, match="no such file"):
        train(_cfg(uneven, tiny_model, tmp_path / "o", processes=2, accelerate_config=tmp_path / "missing.yaml"))
