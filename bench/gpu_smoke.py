"""The stages of the GPU smoke (`bench/gpu_smoke.sh` runs them and prints the table).

- `model`:  a random Qwen3 policy, 0.5B-class (28 layers, hidden 1024, 16/8 heads of 128, MLP 3072,
            the project tokenizer's small vocabulary), written as a model folder in bf16.
- `train`:  one optimizer step on one packed tree of `--tree-tokens` tokens (a GRPO-like group:
            a shared prompt, then 8 sampled answers with tool results), bf16 weights, the tree
            attention named by `--attention`; under torchrun with more than one process the model is
            sharded with FSDP (`fully_shard` per decoder layer) and every rank takes the same step.
            Rank 0 saves the updated weights as a checkpoint.
- `engine`: the serving engine (`--engine`, vllm on the GPU) on the random policy: sample, reload
            the checkpoint (policy_version must go up), sample again; the mismatch of each batch's
            logprobs against the trainer's fp32 recomputation with the weights the engine should
            hold (docs/engines.md), and against the other weights, which must differ.
- `report`: one table of every stage's rows.

Each stage appends JSON rows to `<work>/rows.jsonl`; a stage that cannot run writes a row saying
why and exits non-zero, so the table always shows what ran. `--dry` shrinks everything so the CPU
can exercise the same code (segments attention, the hf engine) in a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path

import results_md  # bench/results_md.py: --write-results

LARGE = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             intermediate_size=3072)
DRY = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
           intermediate_size=128)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def emit(work: Path, stage: str, status: str, detail: str, seconds: float = 0.0) -> None:
    if rank() == 0:
        with open(work / "rows.jsonl", "a") as f:
            f.write(json.dumps({"stage": stage, "status": status, "detail": detail, "seconds": round(seconds, 1)}) + "\n")
    print(f"[gpu-smoke] {stage}: {status}: {detail}", flush=True)


def stage_model(args) -> None:
    import torch
    from transformers import AutoConfig, Qwen3ForCausalLM

    from clawgym.models.tiny import init_model

    t0 = time.monotonic()
    init_model(args.work / "model", seed=0, size="tiny", force=True)  # the tokenizer and generation config
    base = AutoConfig.from_pretrained(args.work / "model")
    # A new config of the tiny model's type with the sizes below: fields derived from the layer count (the
    # per-layer attention types) are computed again, which setting attributes on the loaded config would skip.
    fields = {k: v for k, v in base.to_dict().items() if k != "layer_types"}
    fields |= DRY if args.dry else LARGE
    fields["max_position_embeddings"] = max(base.max_position_embeddings, args.tree_tokens + 1024)
    config = type(base)(**fields)
    torch.manual_seed(0)
    lm = Qwen3ForCausalLM(config).to(torch.bfloat16)
    lm.save_pretrained(args.work / "model")
    n = sum(p.numel() for p in lm.parameters())
    size = f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"
    emit(args.work, "model", "ok", f"random Qwen3, {size} parameters, bf16, vocab {config.vocab_size}", time.monotonic() - t0)


def grpo_tree(vocab: int, total: int, rng: random.Random):
    """TreeNode rows of one group: a shared prompt, then 8 answers each with a tool result and a reply."""
    from clawgym.artifacts import TreeNode

    nodes: list = []

    def add(parent: int, n: int, kind: str, call: str, depth: int) -> int:
        toks = [rng.randrange(4, vocab) for _ in range(n)]
        nodes.append(TreeNode(rollout_id="smoke", node_id=len(nodes), parent_id=parent, token_ids=toks, kind=kind,
                              logprobs=[-1.0] * n if kind == "model" else [], call_id=call, segment=0, role="main",
                              kept=True, depth=depth))
        return len(nodes) - 1

    prompt = total // 2
    per = (total - prompt) // 8
    root = add(-1, prompt, "env", "c0", 0)
    for j in range(8):
        a = add(root, per // 4, "model", f"c0.{j}", prompt)
        b = add(a, per // 2, "env", f"c1.{j}", prompt + per // 4)
        add(b, per - per // 4 - per // 2, "model", f"c1.{j}", prompt + per // 4 + per // 2)
    return nodes


def pick_attention(requested: str, cuda: bool) -> tuple[str, str]:
    """(the attention to use, a note when it is not the requested one)."""
    from clawgym.train.packing import ATTENTIONS

    if requested == "auto":  # the O(L) mask_mod FlexAttention option where this checkout has one, else flex
        flexes = [a for a in ATTENTIONS if a.startswith("flex") and a != "flex"]
        requested = flexes[0] if flexes else "flex"
    if requested in ATTENTIONS and (cuda or not requested.startswith("flex")):
        return requested, ""
    fallback = "flex" if cuda else "segments"
    why = "not an option of this checkout" if requested not in ATTENTIONS else "needs CUDA"
    return fallback, f"attention {requested!r} {why} (have: {', '.join(ATTENTIONS)}); fell back to {fallback!r}"


def stage_train(args) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from clawgym.train.packing import PackedPolicy, collate, pack_tree

    cuda = torch.cuda.is_available()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    attention, note = pick_attention(args.attention, cuda)
    if note:
        emit(args.work, "attention", "fallback", note)
    lm = AutoModelForCausalLM.from_pretrained(args.work / "model", dtype=torch.bfloat16).to(device)
    policy = PackedPolicy(lm)
    sharding = "1 process, no FSDP"
    if world > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in lm.model.layers:
            fully_shard(layer)
        fully_shard(policy)
        sharding = f"FSDP over {world} processes"
    tree = pack_tree(grpo_tree(lm.config.vocab_size, args.tree_tokens, random.Random(0)))
    t0 = time.monotonic()
    mb = collate([tree], [0], attention=attention).to(device)
    t_mask = time.monotonic() - t0
    opt = torch.optim.AdamW(policy.parameters(), lr=args.lr)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.synchronize(device)
    t0 = time.monotonic()
    logp, _ = policy(mb)
    loss = -logp.float().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize(device)
    step_s = time.monotonic() - t0
    peak = f", peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB" if cuda else ""
    ok = bool(torch.isfinite(loss).item())
    if world > 1:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(lm, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        state = None
    if rank() == 0:
        lm.save_pretrained(args.work / "checkpoint", state_dict=state)
    emit(args.work, "train", "ok" if ok else "FAILED",
         f"{tree.n_tokens} tokens, {tree.n_trainable} scored, attention {attention} (mask {t_mask:.2f}s), {sharding}, "
         f"loss {loss.item():.3f}{peak}", step_s)
    if world > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    if not ok:
        sys.exit(1)


async def _engine(args) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from clawgym.engines import EngineConfig, Sampling, make_engine
    from clawgym.run.mismatch import token_stats, trainer_logprobs

    options = {"max_model_len": 4096} if args.engine == "vllm" else {}
    t0 = time.monotonic()
    engine = make_engine(args.engine, EngineConfig(args.work / "model", options))
    emit(args.work, "engine", "ok", f"{args.engine} started", time.monotonic() - t0)
    rng = random.Random(1)
    prompts = [[rng.randrange(4, 1000) for _ in range(args.prompt_tokens)] for _ in range(args.prompts)]
    sampling = Sampling(max_tokens=args.new_tokens, temperature=1.0, seed=0)

    async def sample():
        return await asyncio.gather(*(engine.generate(p, sampling, f"smoke{i}") for i, p in enumerate(prompts)))

    try:
        before = await sample()
        t0 = time.monotonic()
        version = await engine.reload(args.work / "checkpoint")
        emit(args.work, "reload", "ok" if version == 1 else "FAILED", f"policy_version 0 -> {version}", time.monotonic() - t0)
        after = await sample()
    finally:
        await engine.close()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    stats = {}
    for weights in ("model", "checkpoint"):
        trainer = AutoModelForCausalLM.from_pretrained(args.work / weights, dtype=torch.float32).to(device).eval()
        for label, gens in (("before reload", before), ("after reload", after)):
            e = [lp for g in gens for lp in g.output_logprobs]
            t = [lp for p, g in zip(prompts, gens) for lp in trainer_logprobs(trainer, p, g.output_ids)]
            stats[label, weights] = (len(e), *token_stats(e, t))
        del trainer
    failed = version != 1
    for (label, weights), (n, mean_abs, max_abs, k3, outside) in stats.items():
        held = (weights == "model") == (label == "before reload")  # the weights the engine should hold then
        other = stats[label, "checkpoint" if weights == "model" else "model"][1]
        # the engine matches the weights it holds, and matches them better than the other weights
        bad = held and (mean_abs > args.max_mismatch or mean_abs >= other)
        failed |= bad
        emit(args.work, f"mismatch: {label} vs {weights}", "FAILED" if bad else "ok" if held else "other weights",
             f"{n} tokens, mean |Δlogp| {mean_abs:.2e}, max {max_abs:.2e}, k3 KL {k3:.2e}, ratio outside [0.5, 2] {outside:.2%}")
    if failed:
        sys.exit(1)


def stage_report(args) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"GPU smoke ({'dry run on CPU' if args.dry else 'one step, one reload'})")
    for col in ("stage", "status", "detail", "s"):
        table.add_column(col)
    path = args.work / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    for r in rows:
        table.add_row(r["stage"], r["status"], r["detail"], f"{r['seconds']:.1f}")
    Console(width=220).print(table)
    if not rows or any(r["status"].startswith("FAILED") for r in rows):
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", nargs="?", choices=["model", "train", "engine", "report"])
    ap.add_argument("--work", type=Path)
    ap.add_argument("--small", action="store_true", help="every stage's dry run on the CPU (bench/gpu_smoke.sh with "
                                                         "GPU_SMOKE_DRY=1): the hf engine, segments attention, tiny sizes")
    ap.add_argument("--dry", action="store_true", help="tiny sizes, so the CPU can run every stage")
    ap.add_argument("--attention", default="auto")
    ap.add_argument("--engine", default="vllm")
    ap.add_argument("--tree-tokens", type=int, default=32768)
    ap.add_argument("--lr", type=float, default=1e-3, help="large, so the reloaded weights visibly differ")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--max-mismatch", type=float, default=0.1, help="mean |Δlogp| above which the engine's weights are wrong")
    args = results_md.parse(ap)
    if args.small:
        import os
        import subprocess

        script = Path(__file__).with_name("gpu_smoke.sh")
        sys.exit(subprocess.run(["bash", str(script)], env={**os.environ, "GPU_SMOKE_DRY": "1"}).returncode)
    if args.stage is None or args.work is None:
        ap.error("give a stage and --work (or --small)")
    args.work.mkdir(parents=True, exist_ok=True)
    try:
        if args.stage == "engine":
            asyncio.run(_engine(args))
        else:
            {"model": stage_model, "train": stage_train, "report": stage_report}[args.stage](args)
    except SystemExit:
        raise
    except Exception as e:  # one row naming what failed, the traceback in the log; the report still prints what ran
        traceback.print_exc()
        emit(args.work, args.stage, "FAILED", f"{type(e).__name__}: {str(e)[:300]}")
        sys.exit(1)


if __name__ == "__main__":
    main()
