"""`clawgym train`: GRPO, PPO or SFT over packed prefix trees, in one function read top to bottom.

    clawgym train runs/demo/step-0001 --model models/tiny --out runs/demo/checkpoints/step-0001

Phases (numbered in `train`): load trees and rollouts → choose rollouts and their signal → pack
each tree into one sequence → models and optimizers (or resume) → logp_old / logp_ref / values
from the same packed forward, no grad → [PPO] value warm-up and A_t = R − V(s_t) → epochs ×
minibatches of clipped updates with gradient accumulation over token-budget micro-batches →
metrics per update (train.jsonl) → an HF checkpoint per epoch, the last one complete.

Paper §2.3, §3.2.3–3.2.4; docs/models.md. The math lives in `losses.py`, the packing in
`packing.py` and `attention.py`; this file only wires them. CPU runs fp32 with per-segment SDPA;
CUDA runs bf16 autocast with FlexAttention (a mask_mod over node ids, O(L) memory). accelerate places the models and wraps
them for `accelerate launch` (DDP, or FSDP2 with `--fsdp`: fsdp.py);
the trees are sharded across processes by token count and the loss normalization is global
(distributed.py; docs/training.md), and rank 0 alone writes checkpoints and metrics. `[train]
processes = N` launches the ranks itself. 1 vs 2 processes (DDP and FSDP) is tested on CPU with gloo.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import torch
from rich.console import Console

from clawgym import console as shared_console
from clawgym.artifacts import JsonlWriter, atomic_write_bytes, MetricsLine, RolloutRecord, read_jsonl, read_table
from clawgym.errors import UserError
from clawgym.layout import StepLayout
from clawgym.train import checkpoint as ckpt
from clawgym.train import fsdp
from clawgym.train import lora
from clawgym.train import memory
from clawgym.train.precision import MasterWeights, enable_activation_checkpointing
from clawgym.train.distributed import Dist, accelerator_kwargs, launch, padded_plan, read_spec, shard
from clawgym.train import losses as L
from clawgym.train.attention import implementation
from clawgym.train.config import ALGOS, PRECISIONS, TrainConfig
from clawgym.train.packing import ATTENTIONS, PackedPolicy, PackedTree, collate, pack_tree
from clawgym.train.step_metrics import reduce_updates
from clawgym.train.support import check_config, self_test
from clawgym.train import trie
from clawgym.train.value import VALUE_DIR, load_value_model
from clawgym.trees import read_trees


@dataclass
class TrainResult:
    out: Path
    updates: int
    rollouts: int
    trainable_tokens: int
    last: dict[str, float]
    """the last update's train.jsonl line"""
    metrics: dict[str, float] = field(default_factory=dict)
    """the step's train/ metrics: every update's line reduced by step_metrics.REDUCTIONS"""


def _check(cfg: TrainConfig) -> None:
    if cfg.algo not in ALGOS:
        raise UserError(f"--algo must be one of {', '.join(ALGOS)}, got {cfg.algo!r}")
    if cfg.tis not in L.TIS_MODES:
        raise UserError(f"--tis must be one of {', '.join(L.TIS_MODES)}, got {cfg.tis!r}")
    if cfg.aggregation not in L.AGGREGATIONS:
        raise UserError(f"--aggregation must be one of {', '.join(L.AGGREGATIONS)}, got {cfg.aggregation!r}")
    if cfg.precision not in PRECISIONS:
        raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {cfg.precision!r}")
    if cfg.processes < 1:
        raise UserError(f"--processes must be at least 1, got {cfg.processes}")
    if cfg.accelerate_config is not None and not Path(cfg.accelerate_config).is_file():
        raise UserError(f"--accelerate-config {cfg.accelerate_config}: no such file")
    if cfg.attention not in ("auto", *ATTENTIONS):
        raise UserError(f"--attention must be one of auto, {', '.join(ATTENTIONS)}, got {cfg.attention!r}")
    if cfg.attention == "flex" and not torch.cuda.is_available():
        raise UserError("--attention flex needs CUDA (FlexAttention has no backward pass on CPU); use segments or dense on CPU")
    for name in ("epochs", "minibatches", "token_budget"):
        if getattr(cfg, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    if cfg.head_chunk < 0:
        raise UserError(f"--head-chunk must be 0 (no chunks) or more, got {cfg.head_chunk}")
    if cfg.kl_coef > 0 and cfg.ref_model is None:
        raise UserError("--kl-coef > 0 needs --ref-model (the policy to stay close to)")
    lora.check(cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
    if cfg.fsdp and cfg.processes < 2 and int(os.environ.get("WORLD_SIZE", "1")) < 2:
        raise UserError("--fsdp shards across ranks: use it with --processes 2 or more")
    if cfg.fsdp and cfg.lora_rank:
        raise UserError("--fsdp with --lora-rank is not supported (the adapters are small: train them data-parallel without --fsdp)")
    if not (Path(cfg.model) / "config.json").exists():
        raise UserError(f"{cfg.model}: not a model directory (no config.json)")


def _load_config(path: Path):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read the model's config ({e})") from None


def _cat(per_tree, rows: list[int]) -> torch.Tensor:
    """Per-tree token tensors of the given trees, in row order: [T_rows]."""
    return torch.cat([per_tree[i] for i in rows])


def _seq_index(trees: list[PackedTree], rows: list[int]) -> torch.Tensor:
    """[T_rows] long: which of the given trees (0..len(rows)-1) each scored token belongs to."""
    return torch.cat([torch.full((trees[i].n_trainable,), j) for j, i in enumerate(rows)])


def _token_weights(trees: list[PackedTree], rows: list[int], mode: str) -> dict[int, torch.Tensor]:
    """Aggregation weights over a whole minibatch, split back per tree (so micro-batches sum exactly)."""
    w = L.aggregation_weights(_seq_index(trees, rows), mode)
    return dict(zip(rows, w.split([trees[i].n_trainable for i in rows])))


def _score_all(module, trees: list[PackedTree], steps: list, filler: int, attention: str, accelerator,
               dist: Dist) -> list[torch.Tensor]:
    """One no-grad pass of `module` over this rank's micro-batches `steps`; every rank gets every tree's [T] output.

    Same packing, micro-batches and autocast as the update, so logp_old matches the first update's logp.
    """
    mine: dict[int, torch.Tensor] = {}
    with torch.no_grad(), accelerator.autocast():
        for step in steps:
            rows, mb = _collated(step, trees, filler, attention)
            res = module(mb.to(accelerator.device))
            if step is None:  # a padding step: only there so every rank makes the same calls
                continue
            res = res[0] if isinstance(res, tuple) else res
            mine.update(zip(rows, res.float().cpu().split([trees[i].n_trainable for i in rows])))
    every = dist.gather_dict(mine)
    return [every[i] for i in range(len(trees))]


def train(cfg: TrainConfig, console: Console | None = None) -> TrainResult:
    """Train on one step's trees (phases in the module docstring); `console` gets the progress lines
    (default: the shared stderr console; `clawgym run` passes a quiet one unless --verbose)."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    _check(cfg)
    console = console or shared_console.STDERR
    out = Path(cfg.out)
    metrics_path = Path(cfg.metrics) if cfg.metrics else StepLayout(Path(cfg.trees).parent).train_metrics
    if cfg.processes > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        # Not yet inside a launched rank: launch the ranks and read back what rank 0 wrote.
        launch(cfg, cfg.processes, cfg.accelerate_config)
        state = ckpt.load_state(out)
        lines = read_jsonl(metrics_path).records if metrics_path.exists() else []
        return TrainResult(out, state.updates_done, len(state.rollout_ids), 0, {}, reduce_updates(lines))
    cuda = torch.cuda.is_available()
    sharding = fsdp.plugin(bf16=cfg.precision == "bf16") if cfg.fsdp else None
    accelerator = Accelerator(cpu=not cuda, mixed_precision="bf16" if cuda and cfg.precision == "fp32" else "no",
                              kwargs_handlers=accelerator_kwargs(), fsdp_plugin=sharding)
    dist = Dist(accelerator.process_index, accelerator.num_processes)
    if sharding is not None:
        fsdp.enable(accelerator, sharding)
    if dist.main:
        ckpt.recover(out)
    dist.barrier()
    prior = ckpt.load_state(out) if out.exists() else None
    if prior is not None and prior.complete and cfg.resume and not cfg.force:
        # A resumed run (`clawgym run` after a kill) finds this step already trained: nothing to redo.
        console.print(f"{out}: already complete ({prior.updates_done} updates); nothing to resume", highlight=False)
        lines = read_jsonl(metrics_path).records if metrics_path.exists() else []
        return TrainResult(out, prior.updates_done, len(prior.rollout_ids), 0, {}, reduce_updates(lines))
    if prior is not None and prior.complete and not cfg.force:
        raise UserError(f"{out}: already holds a complete checkpoint; pass --force to overwrite it")
    if out.exists() and any(out.iterdir()) and prior is None and not cfg.force:
        raise UserError(f"{out}: exists and is not a clawgym checkpoint; choose an empty --out or pass --force")
    resuming = cfg.resume and prior is not None and not prior.complete
    if prior is not None and not prior.complete and not cfg.resume and not cfg.force:
        raise UserError(f"{out}: holds an interrupted train call; pass --resume to continue it or --force to restart")
    torch.manual_seed(cfg.seed)

    # 1) Load the step's trees and rollouts.
    rollouts = {r.rollout_id: r for r in read_table(cfg.rollouts, RolloutRecord)}
    by_rollout = read_trees(cfg.trees)
    missing = sorted(set(by_rollout) - set(rollouts))
    if missing:
        raise UserError(f"{cfg.trees}: rollout {missing[0]!r} has no row in {cfg.rollouts}")
    if not any(n.trainable for nodes in by_rollout.values() for n in nodes):
        raise UserError(f"{cfg.trees}: no trainable tokens (no kept model node of role main)")

    # 2) Choose rollouts and their signal: GRPO advantages per group, PPO returns, SFT reward filter.
    ids = [rid for rid in by_rollout if rollouts[rid].trainable and any(n.trainable for n in by_rollout[rid])]
    rewards = torch.tensor([float(rollouts[rid].reward) for rid in ids], dtype=torch.float64)  # [R]
    groups = sorted({rollouts[rid].group_id for rid in ids})
    n_zero_var_groups = 0
    if cfg.algo == "grpo":
        gidx = torch.tensor([groups.index(rollouts[rid].group_id) for rid in ids], dtype=torch.long)
        adv, zero = L.grpo_advantages(rewards, gidx, cfg.adv_eps)  # empty in, empty out
        n_zero_var_groups = len({int(g) for g, z in zip(gidx, zero) if z})
        signal = {rid: float(a) for rid, a, z in zip(ids, adv, zero) if not z}
    elif cfg.algo == "ppo":
        signal = {rid: float(r) for rid, r in zip(ids, rewards)}
    else:
        signal = {rid: float(r) for rid, r in zip(ids, rewards) if r >= cfg.min_reward}
    chosen = [rid for rid in ids if rid in signal]
    if resuming and prior.rollout_ids != chosen:
        raise UserError(f"{out}: was written for another batch of rollouts; it cannot be resumed with {cfg.trees}")

    # 3) Pack each chosen rollout's tree into one sequence (trainable nodes and their ancestors only).
    try:
        trees = [pack_tree(by_rollout[rid]) for rid in chosen]
    except UserError as e:
        raise UserError(f"{cfg.trees}: {e}") from None
    T_total = sum(t.n_trainable for t in trees)
    owner = shard([t.n_tokens for t in trees], dist.world)
    filler = min(range(len(trees)), key=lambda i: trees[i].n_tokens, default=0)  # forwarded by padding steps

    # 4) Models and optimizers, placed by accelerate; resume or reuse the previous optimizer state.
    #    The architecture is checked from its config first, then by a packed-vs-per-path self-test.
    src = out if resuming else Path(cfg.model)
    model_config = _load_config(src)
    attention = cfg.attention
    if attention == "auto":
        attention = "flex" if cuda else "segments"
    check_config(model_config)
    attn = implementation(attention)
    # Under LoRA the weights stay those of the start model; a resumed call puts its saved adapter back on them.
    weights = Path(cfg.model) if cfg.lora_rank else src
    # bf16 keeps bf16 weights and fp32 masters beside them; under FSDP the fp32 shards are the masters.
    bf16_weights = cfg.precision == "bf16" and not cfg.fsdp
    try:
        lm = AutoModelForCausalLM.from_pretrained(weights, attn_implementation=attn,
                                                  dtype=torch.bfloat16 if bf16_weights else torch.float32)
    except (OSError, ValueError) as e:
        raise UserError(f"{weights}: cannot load the policy ({e})") from None
    self_test(lm, attention)
    if cfg.activation_checkpointing:
        enable_activation_checkpointing(lm)
    adapter = None
    if cfg.lora_rank:
        adapter = lora.add_adapter(lm, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets,
                                   resume_from=out / lora.ADAPTER_DIR if resuming else None)
    policy = PackedPolicy(lm, cfg.head_chunk)
    master = MasterWeights(lora.trainable(policy)) if bf16_weights else None
    optimizer = torch.optim.AdamW(master.masters if master else lora.trainable(policy), lr=cfg.lr, weight_decay=0.0)
    if sharding is not None:
        fsdp.wrap_layers(sharding, lm)
    policy, optimizer = _prepare(accelerator, policy, optimizer, src / ckpt.OPTIMIZER_FILE,
                                 load=resuming or not cfg.lora_rank)  # a fresh adapter has nothing to do with an earlier step's moments
    value = value_opt = None
    if cfg.algo == "ppo":
        value, fresh_value = load_value_model(src, attn)
        self_test(value.backbone, attention)
        value_opt = torch.optim.AdamW(value.parameters(), lr=cfg.value_lr, weight_decay=0.0)
        value, value_opt = _prepare(accelerator, value, value_opt, src / VALUE_DIR / ckpt.OPTIMIZER_FILE)
    dev = accelerator.device
    # Policy parameter elements in all and the most any one rank holds (under FSDP about 1/N of them).
    n_params = sum(p.numel() for p in policy.parameters())
    params_per_rank = max(dist.gather_list([fsdp.local_numel(policy)]))

    def save(epochs_done: int, updates_done: int, batch: dict) -> None:
        # Under FSDP every rank sends its shards to rank 0 first (a collective).
        gathered = fsdp.checkpoint_state(policy, optimizer, value, value_opt, bf16=cfg.precision == "bf16") if cfg.fsdp else {}
        # Rank 0 writes; the others wait, so no rank runs ahead of a checkpoint it may resume from.
        if not dist.main:
            dist.barrier()
            return
        state = ckpt.TrainerState(cfg.algo, cfg.epochs, epochs_done, updates_done, epochs_done == cfg.epochs, chosen)
        lm_ = accelerator.unwrap_model(policy).lm
        ckpt.save_checkpoint(out, lm=lm_, tokenizer_dir=src, optimizer=gathered.get("optimizer", optimizer),
                             state=state, config=cfg, value=accelerator.unwrap_model(value) if value is not None else None,
                             value_optimizer=gathered.get("value_optimizer", value_opt), batch_state=batch,
                             lm_state=lora.merged_state_dict(lm_) if adapter is not None else gathered.get("lm_state"),
                             value_state=gathered.get("value_state"), adapter=adapter)
        dist.barrier()

    if not trees:
        # Nothing to learn this step (all groups zero-variance, or no rollout above --min-reward):
        # the policy is written unchanged so the loop can go on, and the metrics say why.
        save(cfg.epochs, 0, {})
        if not dist.main:
            return TrainResult(out, 0, 0, 0, {})
        line = MetricsLine(0, {"train/rollouts": 0.0, "train/zero_var_groups": float(n_zero_var_groups),
                               "train/groups": float(len(groups))}, time.time())
        with JsonlWriter(metrics_path) as w:
            w.append(line.to_json())
        console.print(f"nothing to learn: wrote the unchanged policy to {out}", highlight=False)
        return TrainResult(out, 0, 0, 0, {}, reduce_updates([line.values]))

    # Said once the models are loaded and checked, so a refused architecture or option is the only line.
    if dist.main:
        console.print(f"train {cfg.algo}: {len(trees)}/{len(by_rollout)} rollouts, {T_total} trainable tokens, "
                      f"{sum(t.n_tokens for t in trees)} packed tokens for {sum(t.path_tokens for t in trees)} on paths, "
                      f"{n_zero_var_groups}/{len(groups)} zero-variance groups, {dist.world} process(es)", highlight=False)
        console.print(memory.estimate_line(memory.shape_of(model_config), cfg, dist.world), highlight=False)

    # 5) logp_old (and logp_ref, V_old) from the same packed forward before any update.
    budget = cfg.token_budget
    all_rows = list(range(len(trees)))

    def plan(rows: list[int]) -> list:  # this rank's micro-batches of `rows` (group tries when sharing), padded
        return padded_plan(rows, owner, dist.rank, dist.world,
                           lambda mine: trie.plan(trees, mine, budget, cfg.share_prefixes))

    whole = plan(all_rows)  # merged once; every whole-batch pass below reuses it
    if resuming:
        batch = ckpt.load_batch_state(out)
    else:
        batch = {"logp_old": _score_all(policy, trees, whole, filler, attention, accelerator, dist)}
        if cfg.kl_coef > 0:
            # The reference model is not wrapped (it takes no gradient), so its calls need not match across ranks.
            ref = PackedPolicy(AutoModelForCausalLM.from_pretrained(cfg.ref_model, attn_implementation=attn, dtype=torch.float32),
                               cfg.head_chunk).to(dev)
            batch["logp_ref"] = _score_all(ref, trees, whole, filler, attention, accelerator, dist)
            del ref
    logp_old, logp_ref = batch["logp_old"], batch.get("logp_ref")
    logp_rollout = [t.rollout_logprobs[t.trainable] for t in trees]  # trainable tokens only are scored
    returns = [torch.full((t.n_trainable,), signal[t.rollout_id], dtype=torch.float32) for t in trees]

    # 6) [PPO] A fresh value model starts at the batch's mean return and is fitted before the policy
    #    moves; then A_t = R − V(s_t), whitened over the batch. GRPO/SFT broadcast per rollout.
    warmup_losses: list[float] = []
    advantages = returns
    if value is not None:
        batch_w = _token_weights(trees, all_rows, cfg.aggregation)  # Σ = 1 over the whole batch
        if not resuming:
            if fresh_value:
                accelerator.unwrap_model(value).start_at(float(sum((batch_w[i] * returns[i]).sum() for i in all_rows)))
            for _ in range(cfg.value_warmup_steps):
                warmup_losses.append(_value_step(value, value_opt, accelerator, trees, whole, filler, returns, cfg,
                                                 attention, dev, batch_w, dist))
            batch["values"] = _score_all(value, trees, whole, filler, attention, accelerator, dist)
        advantages = [L.ppo_advantages(v, r) for v, r in zip(batch["values"], returns)]
        if cfg.norm_adv:
            flat = L.whiten(torch.cat(advantages), torch.cat([batch_w[i] for i in all_rows]))
            advantages = list(flat.split([t.n_trainable for t in trees]))

    kept: list[dict] = []  # this call's earlier updates (a resumed call): they count in the step's metrics
    if resuming and metrics_path.exists() and dist.main:
        # Lines written after the checkpoint we resume from would be repeated: drop them.
        kept = [r for r in read_jsonl(metrics_path).records if r.get("train/update", 0) <= prior.updates_done]
        atomic_write_bytes(metrics_path, b"".join(orjson.dumps(r) + b"\n" for r in kept))

    # 7) Epochs × minibatches of clipped updates; each minibatch is one optimizer step, accumulated
    #    over micro-batches with weights that make the sum a token-mean (or rollout-mean) of the minibatch.
    writer = JsonlWriter(metrics_path) if dist.main else None
    update = prior.updates_done if resuming else 0
    last: dict[str, float] = {}
    updates: list[dict] = list(kept)
    for epoch in range(prior.epochs_done if resuming else 0, cfg.epochs):
        order = torch.randperm(len(trees), generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch)).tolist()
        n_mb = min(cfg.minibatches, len(trees))
        for mb_rows in [order[k::n_mb] for k in range(n_mb)]:
            t0 = time.perf_counter()
            weights = _token_weights(trees, mb_rows, cfg.aggregation)
            sums = {k: 0.0 for k in ("loss", "pg_loss", "kl_ref", "clip_frac", "tis_clip_frac", "entropy",
                                      "mismatch_abs", "mismatch_k3", "value_loss", "value_mean", "adv_mean")}
            seq_ratios, tokens_fwd = [], 0
            steps = plan(mb_rows)
            for j, step in enumerate(steps):
                pad = step is None  # a zero-weight step, only there so every rank makes the same calls
                rows, mb = _collated(step, trees, filler, attention)
                mb = mb.to(dev)
                tokens_fwd += 0 if pad else mb.n_tokens
                w = torch.zeros(trees[filler].n_trainable) if pad else _cat(weights, rows)
                w, old, roll = w.to(dev), _cat(logp_old, rows).to(dev), _cat(logp_rollout, rows).to(dev)
                adv = _cat(advantages, rows).to(dev)
                local_seq = _seq_index(trees, rows).to(dev)
                with accelerator.autocast():
                    logp, ent = policy(mb, with_entropy=True)
                if cfg.algo == "sft":  # cross-entropy on the kept main-role model tokens
                    per_tok, kl = -logp, None
                    clipped = tis_trunc = torch.zeros_like(logp, dtype=torch.bool)
                else:
                    pg, clipped = L.clipped_surrogate(logp, old, adv, cfg.clip_low, cfg.clip_high)
                    tis_w, tis_trunc = L.tis_weights(old, roll, local_seq, cfg.tis, cfg.tis_cap)
                    per_tok = tis_w * pg
                    kl = L.k3_kl(logp, _cat(logp_ref, rows).to(dev)) if logp_ref is not None else None
                    if kl is not None:
                        per_tok = per_tok + cfg.kl_coef * kl
                    sums["pg_loss"] += float((w * pg).detach().sum())
                loss = (w * per_tok).sum()
                # DDP averages gradients over ranks; × world makes the ranks' partial sums add up to the loss.
                # Gradients are all-reduced once per minibatch, on its last micro-batch.
                with _sync_last(accelerator, policy, j == len(steps) - 1, cfg.fsdp):
                    accelerator.backward(loss * dist.world)
                if pad:
                    continue
                # Metrics: each a weighted mean over the minibatch's trainable tokens.
                lr_ = (old - roll).detach()
                for k, v in (("loss", loss), ("clip_frac", clipped.float()), ("tis_clip_frac", tis_trunc.float()),
                             ("entropy", ent), ("mismatch_abs", lr_.abs()), ("mismatch_k3", L.k3_kl(roll, old)),
                             ("adv_mean", adv), ("kl_ref", kl)):
                    if v is not None:
                        sums[k] += float(v.detach().sum()) if k == "loss" else float((w * v.detach()).sum())
                seq_ratios += [float(x) for x in torch.zeros(len(rows), device=dev).index_add_(0, local_seq, lr_).exp()]
            sums = dist.sum({**sums, "tokens_forwarded": float(tokens_fwd)})
            tokens_fwd, seq_ratios = int(sums.pop("tokens_forwarded")), dist.gather_list(seq_ratios)
            grad_norm = float(accelerator.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm))
            if master is not None:
                master.grads_in()
            optimizer.step()
            if master is not None:
                master.weights_out()
                policy.zero_grad(set_to_none=True)
            optimizer.zero_grad(set_to_none=True)
            if value is not None:
                sums["value_loss"] = _value_step(value, value_opt, accelerator, trees, steps, filler, returns, cfg,
                                                 attention, dev, weights, dist)
                sums["value_mean"] = float(sum((weights[i] * batch["values"][i]).sum() for i in mb_rows))
            update += 1
            dt = time.perf_counter() - t0
            # 8) One metrics line per update.
            vals = {f"train/{k}": v for k, v in sums.items()
                    if not (k.startswith("value") and value is None) and not (k == "kl_ref" and logp_ref is None)}
            vals.update({
                "train/update": float(update), "train/epoch": float(epoch), "train/lr": cfg.lr,
                "train/grad_norm": grad_norm, "train/tokens_forwarded": float(tokens_fwd),
                "train/tokens_per_s": tokens_fwd / dt if dt > 0 else math.inf,
                "train/tree_token_ratio": sum(trees[i].n_tokens for i in mb_rows) / sum(trees[i].path_tokens for i in mb_rows),
                # the whole batch's tokens that packing each tree once saves over forwarding every
                # root-to-leaf path on its own (per epoch)
                "train/tokens_saved": float(sum(t.path_tokens - t.n_tokens for t in trees)),
                "train/trainable_tokens": float(sum(trees[i].n_trainable for i in mb_rows)),
                "train/rollouts": float(len(mb_rows)), "train/groups": float(len(groups)),
                "train/processes": float(dist.world),
                "train/params": float(n_params), "train/params_per_rank": float(params_per_rank),
                "train/zero_var_groups": float(n_zero_var_groups),
                "train/tis_seq_ratio": sum(seq_ratios) / len(seq_ratios),
            })
            if warmup_losses:
                vals["train/value_warmup_loss_first"], vals["train/value_warmup_loss_last"] = warmup_losses[0], warmup_losses[-1]
            last = vals
            updates.append(vals)
            if writer is None:
                continue
            writer.append(MetricsLine(update, vals, time.time()).to_json())
            console.print(f"update {update} | loss {vals['train/loss']:.4f} | clip {vals['train/clip_frac']:.3f} | "
                          f"entropy {vals['train/entropy']:.3f} | grad {grad_norm:.3f} | {vals['train/tokens_per_s']:.0f} tok/s",
                          highlight=False)
        # 9) Checkpoint after every epoch (atomic); the last one is marked complete.
        save(epoch + 1, update, batch)
    if writer is not None:
        writer.close()
    return TrainResult(out, update, len(trees), T_total, last, reduce_updates(updates))


def _prepare(accelerator, model, optimizer, saved_optimizer: Path, load: bool = True):
    """accelerate's prepare, with the optimizer state saved at `saved_optimizer` (if any and `load`)
    loaded: before wrapping, or after it under FSDP, where every rank keeps its shard of the full state."""
    sharded = accelerator.is_fsdp2
    if load and not sharded:
        ckpt.load_optimizer(optimizer, saved_optimizer)
    model, optimizer = accelerator.prepare(model, optimizer)
    if load and sharded:
        ckpt.load_optimizer(optimizer, saved_optimizer, apply=lambda state: fsdp.load_optimizer(model, optimizer, state))
    return model, optimizer


def _sync_last(accelerator, model, last: bool, sharded: bool):
    """Gradients all-reduced on a minibatch's last micro-batch only (DDP); FSDP reduce-scatters every
    micro-batch into the shards, since skipping that would keep whole unsharded gradients."""
    return accelerator.no_sync(model) if not last and not sharded else contextlib.nullcontext()


def _collated(step, trees: list[PackedTree], filler: int, attention: str):
    """(tree indices in label order, micro-batch) of a planned step; a padding step (None) forwards
    the smallest tree, which the caller weighs zero."""
    rows, parts = step if step is not None else ([filler], [trees[filler]])
    return rows, collate(parts, range(len(parts)), attention=attention)


def _value_step(value, opt, accelerator, trees, steps, filler, returns, cfg, attention, dev, weights, dist) -> float:
    """One value-model optimizer step on this rank's micro-batches `steps` (None: a zero-weight padding step):
    masked ½(V − R)² under the minibatch's weights, summed over ranks."""
    total = 0.0
    for k, step in enumerate(steps):
        pad = step is None
        rows, mb = _collated(step, trees, filler, attention)
        mb = mb.to(dev)
        with accelerator.autocast():
            v = value(mb)
        w = torch.zeros(trees[filler].n_trainable) if pad else _cat(weights, rows)
        loss = (w.to(dev) * L.value_loss(v, _cat(returns, rows).to(dev))).sum()
        with _sync_last(accelerator, value, k == len(steps) - 1, cfg.fsdp):
            accelerator.backward(loss * dist.world)
        total += float(loss.detach())
    accelerator.clip_grad_norm_(value.parameters(), cfg.max_grad_norm)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return dist.sum({"v": total})["v"]


def main(argv: list[str]) -> int:
    """A launched rank: `python -m clawgym.train.loop SPEC.json` (distributed.launch starts N of them)."""
    import sys

    try:
        train(read_spec(Path(argv[0])))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
