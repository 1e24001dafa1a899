"""Benchmark tree packing: packed trees vs per-trajectory vs per-call, forward + backward, same model.

For each tree shape the same trainable tokens are scored three ways (plus the packed tree with a
dense mask, to show what segment attention saves), all batched by the same token-budget planner:

- tree:       each rollout's tree packed into one sequence (clawgym's training path, segment attention)
- tree-dense: the same packing with a dense [L, L] ancestor mask for SDPA
- per-traj:   each root-to-leaf path of the (pruned) tree as its own causal sample, shared tokens
              weighted 1/paths — the baseline of Tree Training, AReaL and prime-rl
- per-call:   each trainable call's prompt + output as its own causal sample, scoring the output

Shapes, as real harness rollouts make them: Claude-Code-like (one long chain, two subagents, two retries, a
compaction after which the agent continues from system prompt + summary), GRPO-like (one long
prefix, many answers), branchy (a depth-3 binary tree of turns), and an unbranched chain.

Reported: tokens forwarded (exact), attention query-key pairs evaluated, wall time of forward +
backward (median of --repeats after a warm-up, modes interleaved round by round) with the process
CPU time beside it (steadier when other jobs share the cores), and activation bytes saved for
backward by the largest micro-batch (unique storages seen by a saved-tensors hook: deterministic,
a better CPU memory figure than RSS).

    python bench/train.py            # tiny init-model policy, 1 thread, a few minutes

With `--lora-rank R` it instead compares one optimizer step (forward + backward + AdamW) of full
fine-tuning with LoRA adapters of rank R, on the same packed trees: step time and the bytes of
gradients + optimizer state, with the full/LoRA ratios. The model is `--model`, or a SmolLM2-135M-
shaped Llama (hidden 576, 30 layers, 9 heads / 3 KV heads, head_dim 64, vocab 49,152) with random
weights — the same shapes, so the same time and memory:

    python bench/train.py --lora-rank 16 --shapes grpo-like --scale 0.25 --repeats 1 --threads 2

With `--masks` it compares the tree masks of `--attention dense`, a FlexAttention block mask built
from that dense mask, `--attention flex` (a mask_mod over node ids, no [L, L] mask) and `--attention
segments` on a branched tree of 8k and 32k tokens: bytes the mask keeps, build time, and forward +
backward time where this machine can run it (every mask on CUDA; FlexAttention has no backward on CPU):

    nice -n 10 python bench/train.py --masks

With `--harness` it runs whole harness-shaped steps (`claude_code_step`: 4 tasks × 4 rollouts under
one ~6k-token system prompt, 3–8 calls each, subagents with their own shared prompt;
`openclaw_step`: 2 tasks × 4 rollouts under ~19k tokens, each branching where its context was
pruned) as the trainer plans them, three ways: before (today's budget, the whole LM head), after
(the chunked head, same budget) and after with the budget that the same memory holds with the
chunked head (clawgym.train.memory); then, at both budgets with the chunked head, the step's
shared system prompt forwarded once for the whole step (clawgym.train.prefix) instead of once per
micro-batch. It prints tokens forwarded / the step's unique tokens, process
CPU time of forward + backward / a plain causal pass over the unique tokens (cut into budget-long
rows, the same number of scored tokens), and the LM head's peak resident memory per trainable token
(measured alone in a fresh process, with the micro-batch's trainable tokens), then the head alone
at 1k and 4k trainable tokens with SmolLM2's 49k vocabulary:

    nice -n 10 python bench/train.py --harness                                  # tiny model
    nice -n 10 python bench/train.py --harness --models smollm2 --repeats 1     # SmolLM2-135M, reduced steps

`--small` runs the harness steps tiny (a 180-token system prompt), once, as a correctness check
(chunked and whole head give the same logprobs, entropies and gradients, and so do the step prefix
and the tries; exit 1 if not), in seconds. The log line of each run also gives its attention
query-key pairs beside the plain rows' and beside every unique token over its whole root path
(what exact attention needs: plain rows cut those paths at the budget).

With `--group` it packs a Claude-Code-like GRPO group (8 rollouts sharing a 19k-token prompt, then
each its own turns) as one tree per rollout vs one group trie (`--share-prefixes`, trie.py):
tokens forwarded and forward + backward wall time, with the ratios:

    nice -n 10 python bench/train.py --group
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from clawgym import peak_memory
from clawgym.artifacts import TreeNode
from clawgym.train import lora
from clawgym.train.attention import TreePlan, implementation
from clawgym.train.config import HEAD_CHUNK
from clawgym.train.lm_head import chunked_logprobs
from clawgym.train.packing import PackedPolicy, PackedTree, collate, pack_tree, plan_microbatches, root_paths

import results_md  # bench/results_md.py: --write-results


# ---------------------------------------------------------------------------------------------
# Synthetic trees (TreeNode rows, as build-trees writes them)
# ---------------------------------------------------------------------------------------------


class TreeMaker:
    def __init__(self, rid: str, rng: random.Random, vocab: int):
        self.rid, self.rng, self.vocab, self.nodes, self.end = rid, rng, vocab, [], {}

    def add(self, parent: int, n: int, kind: str, call: str, role: str = "main", kept: bool = True, drop: str = "",
            toks: list[int] | None = None) -> int:
        nid = len(self.nodes)
        depth = 0 if parent < 0 else self.end[parent]
        toks = toks if toks is not None else [self.rng.randrange(4, self.vocab) for _ in range(n)]
        lps = [-self.rng.random() for _ in toks] if kind == "model" else []
        self.nodes.append(TreeNode(self.rid, nid, parent, toks, kind, lps, call, 0, role, kept, depth, drop))
        self.end[nid] = depth + len(toks)
        return nid

    def r(self, a: int, b: int) -> int:
        return self.rng.randint(a, b)


def claude_code(rid: str, rng: random.Random, vocab: int, s: float) -> list[TreeNode]:
    """System prompt + tools, a long main chain, 2 subagents, 2 retries, a compaction, then segment 2."""
    t = TreeMaker(rid, rng, vocab)
    system = t.add(-1, int(1000 * s), "env", "c0")
    turns, compact_at = int(40 * s), int(28 * s)
    x = t.add(system, 80, "env", "c0")  # the user's task
    for k in range(turns):
        if k == compact_at:
            ask = t.add(x, 30, "env", f"compact{k}", "compaction", True, "compaction")
            t.add(ask, 150, "model", f"compact{k}", "compaction", True, "compaction")
            x = t.add(system, 200, "env", f"c{k}")  # segment 2: system prompt + the summary
        if k in (3, int(20 * s)):  # a retried turn: the superseded attempt is a dead leaf
            t.add(x, t.r(20, 60), "model", f"c{k}-retry", kept=False, drop="dead_leaf")
        out = t.add(x, t.r(20, 60), "model", f"c{k}")
        if k in (6, int(18 * s)):  # a subagent: its own system prompt, three calls
            y = t.add(-1, int(400 * s), "env", f"sub{k}", "subagent", True, "subagent")
            for j in range(3):
                y = t.add(y, t.r(30, 60), "model", f"sub{k}.{j}", "subagent", True, "subagent")
                y = t.add(y, t.r(40, 120), "env", f"sub{k}.{j + 1}", "subagent", True, "subagent")
        x = t.add(out, t.r(30, 120), "env", f"c{k + 1}")  # tool output
    return t.nodes


def grpo_like(rid: str, rng: random.Random, vocab: int, s: float) -> list[TreeNode]:
    """One long prefix and many sampled answers."""
    t = TreeMaker(rid, rng, vocab)
    p = t.add(-1, int(1024 * s), "env", "c0")
    for j in range(8):
        t.add(p, 64, "model", f"c{j}")
    return t.nodes


def branchy(rid: str, rng: random.Random, vocab: int, s: float) -> list[TreeNode]:
    """A depth-3 binary tree of turns (model 32 + env 32) under a shared prompt: 8 leaves."""
    t = TreeMaker(rid, rng, vocab)
    frontier = [t.add(-1, int(256 * s), "env", "c0")]
    for level in range(3):
        nxt = []
        for parent in frontier:
            for b in range(2):
                m = t.add(parent, 32, "model", f"c{level}.{parent}.{b}")
                nxt.append(t.add(m, 32, "env", f"c{level + 1}.{parent}.{b}") if level < 2 else m)
        frontier = nxt
    return t.nodes


def chain(rid: str, rng: random.Random, vocab: int, s: float) -> list[TreeNode]:
    """No branching at all: prompt + turns."""
    t = TreeMaker(rid, rng, vocab)
    x = t.add(-1, int(256 * s), "env", "c0")
    for k in range(int(12 * s)):
        m = t.add(x, 40, "model", f"c{k}")
        x = t.add(m, 80, "env", f"c{k + 1}")
    return t.nodes


SHAPES = {"claude-code": (claude_code, 1), "grpo-like": (grpo_like, 2), "branchy": (branchy, 2), "chain": (chain, 2)}


# ---------------------------------------------------------------------------------------------
# The three ways to score the same tokens
# ---------------------------------------------------------------------------------------------


def as_chain(tree: PackedTree, path: torch.Tensor, scored: torch.Tensor) -> PackedTree:
    """A causal sample of the given positions of a packed tree, scoring the positions in `scored`."""
    n = path.numel()
    at = {int(p): i for i, p in enumerate(path.tolist())}
    idx = torch.tensor([at[int(p)] for p in scored.tolist()], dtype=torch.long)
    return PackedTree(
        rollout_id=tree.rollout_id, input_ids=tree.input_ids[path], position_ids=torch.arange(n),
        node_index=torch.zeros(n, dtype=torch.long), node_parent=[-1], node_start=[0],
        ancestors=torch.ones(1, 1, dtype=torch.bool), pred_pos=idx - 1, label_pos=idx,
        target_ids=tree.input_ids[scored], trainable=torch.ones(len(idx), dtype=torch.bool),
        rollout_logprobs=torch.zeros(len(idx)), prev_pos=torch.arange(n) - 1, leaf_ends=[n - 1],
        path_tokens=n, is_chain=True,
    )


def samples(nodes: list[TreeNode], mode: str) -> tuple[list[PackedTree], list[torch.Tensor]]:
    """The samples one tree becomes under `mode`, with a loss weight per scored token."""
    tree = pack_tree(nodes)
    if mode in ("tree", "tree-dense"):
        return [tree], [torch.ones(tree.n_trainable)]
    scored = tree.label_pos[tree.trainable]
    if mode == "per-traj":
        paths = root_paths(tree)
        count = torch.zeros(tree.n_tokens)
        for p in paths:
            count[p] += 1
        out = []
        for p in paths:
            s = p[torch.isin(p, scored)]
            out.append((as_chain(tree, p, s), 1.0 / count[s]))
        return [o[0] for o in out], [o[1] for o in out]
    # per-call: each trainable node is one call's output; its prompt is everything above it.
    starts = tree.node_start + [tree.n_tokens]
    trainable_pos = set(scored.tolist())
    out_t, out_w = [], []
    for i in range(len(tree.node_parent)):
        own = torch.arange(starts[i], starts[i + 1])
        own = own[torch.tensor([int(p) in trainable_pos for p in own], dtype=torch.bool)]
        if own.numel() == 0:
            continue
        path, p = [], starts[i + 1] - 1
        while p >= 0:
            path.append(p)
            p = int(tree.prev_pos[p])
        out_t.append(as_chain(tree, torch.tensor(path[::-1]), own))
        out_w.append(torch.ones(own.numel()))
    return out_t, out_w


def attention_pairs(mb) -> int:
    m = mb.attention_mask
    if m is None:
        L = mb.input_ids.shape[1]
        return L * (L + 1) // 2
    if isinstance(m, TreePlan) and m.dense is not None:
        return int(m.dense.shape[0] * m.dense.shape[-1] * m.dense.shape[-2])
    if isinstance(m, TreePlan):
        return sum((b.q1 - b.q0) * (b.q1 - b.q0 + 1) // 2 if b.mask is None else b.mask.numel() for r in m.rows for b in r)
    return int(m.shape[0] * m.shape[-1] * m.shape[-2])


@dataclass
class Result:
    tokens: int
    pairs: int
    wall_ms: float
    cpu_ms: float
    saved_mib: float


class Mode:
    """One way of scoring a shape's tokens: its micro-batches, ready to run forward + backward."""

    def __init__(self, policy: PackedPolicy, trees: list[PackedTree], weights: list[torch.Tensor], attention: str, budget: int):
        self.policy = policy
        plan = plan_microbatches([t.n_tokens for t in trees], budget)
        self.batches = [(collate(trees, rows, attention=attention), torch.cat([weights[i] for i in rows])) for rows in plan]
        self.tokens = sum(mb.n_tokens for mb, _ in self.batches)
        self.pairs = sum(attention_pairs(mb) for mb, _ in self.batches)
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def step(self, record: bool = True) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        for mb, w in self.batches:
            logp, _ = self.policy(mb)
            (-(w * logp).sum()).backward()
        self.policy.zero_grad(set_to_none=True)
        if record:
            self.wall.append((time.perf_counter() - t0) * 1000)
            self.cpu.append((time.process_time() - c0) * 1000)

    def saved_mib(self) -> float:
        """Activation bytes kept for backward by the largest micro-batch, each storage counted once."""
        params = {p.untyped_storage().data_ptr() for p in self.policy.parameters()}
        most = 0
        for mb, w in self.batches:
            seen: dict[int, int] = {}

            def pack(x: torch.Tensor):
                seen.setdefault(x.untyped_storage().data_ptr(), x.untyped_storage().nbytes())
                return x

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
                logp, _ = self.policy(mb)
                loss = -(w * logp).sum()
            most = max(most, sum(v for k, v in seen.items() if k not in params))
            loss.backward()
        self.policy.zero_grad(set_to_none=True)
        return most / 2**20

    def result(self) -> Result:
        return Result(self.tokens, self.pairs, statistics.median(self.wall), statistics.median(self.cpu), self.saved_mib())


def smollm2_135m_shape():
    """SmolLM2-135M's architecture (its config.json's shapes), for random weights."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                       rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)


def lora_vs_full(args) -> None:
    """One optimizer step of full fine-tuning vs LoRA adapters: time, and gradient + optimizer-state bytes."""
    from transformers import AutoModelForCausalLM

    attn = implementation("segments")

    def load():
        torch.manual_seed(0)
        if args.model is not None:
            return AutoModelForCausalLM.from_pretrained(args.model, attn_implementation=attn, dtype=torch.float32)
        return AutoModelForCausalLM.from_config(smollm2_135m_shape(), attn_implementation=attn, dtype=torch.float32)

    make, n_trees = SHAPES[args.shapes.split(",")[0]]
    rng = random.Random(0)
    rows = {}
    for mode in ("full", "lora"):
        lm = load()
        if mode == "lora":
            lora.add_adapter(lm, args.lora_rank, 2.0 * args.lora_rank, args.lora_targets)
        policy = PackedPolicy(lm)
        params = lora.trainable(policy)
        opt = torch.optim.AdamW(params, lr=1e-5)
        if mode == "full":
            trees = [pack_tree(make(f"t{i}", rng, lm.config.vocab_size, args.scale)) for i in range(n_trees)]
            batches = [collate(trees, r) for r in plan_microbatches([t.n_tokens for t in trees], args.budget)]
        times, grad_bytes, state_bytes = [], 0, 0
        for r in range(1 + args.repeats):
            t0 = time.perf_counter()
            for mb in batches:
                logp, _ = policy(mb)
                (-logp.mean()).backward()
            grad_bytes = sum(p.grad.nbytes for p in params if p.grad is not None)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if r:
                times.append(time.perf_counter() - t0)
            state_bytes = sum(v.nbytes for st in opt.state.values() for v in st.values() if torch.is_tensor(v))
        rows[mode] = (sum(p.numel() for p in params), statistics.median(times), grad_bytes, state_bytes)
        print(f"{mode}: {rows[mode][0]:,} trainable params, step {rows[mode][1]:.2f} s, "
              f"gradients {grad_bytes / 2**20:.1f} MiB, optimizer state {state_bytes / 2**20:.1f} MiB", flush=True)
        del policy, opt, lm
    table = Table(title=f"one optimizer step, full vs LoRA rank {args.lora_rank} ({args.lora_targets}), "
                        f"{sum(t.n_tokens for t in trees):,} packed tokens, {args.threads} threads, median of {args.repeats}")
    for col in ("mode", "trainable params", "step s", "grad MiB", "optimizer MiB", "grad+optimizer MiB"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for mode, (n, t, g, o) in rows.items():
        table.add_row(mode, f"{n:,}", f"{t:.2f}", f"{g / 2**20:.1f}", f"{o / 2**20:.1f}", f"{(g + o) / 2**20:.1f}")
    (nf, tf, gf, of), (nl, tl, gl, ol) = rows["full"], rows["lora"]
    table.add_row("full / lora", f"{nf / nl:.0f}x", f"{tf / tl:.2f}x", f"{gf / gl:.0f}x", f"{of / ol:.0f}x", f"{(gf + of) / (gl + ol):.0f}x")
    Console(width=200).print(table)


def _tiny_policy(args) -> PackedPolicy:
    from transformers import AutoModelForCausalLM

    from clawgym.models.tiny import init_model

    torch.manual_seed(0)
    model_dir = args.model
    if model_dir is None:
        model_dir = Path(tempfile.mkdtemp()) / "tiny"
        init_model(model_dir, seed=0, size="tiny")
    return PackedPolicy(AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=implementation("segments"),
                                                             dtype=torch.float32))


def _fwd_bwd_s(policy: PackedPolicy, batches, device: torch.device | None = None) -> float:
    """Wall seconds of forward + backward over `batches` (on `device`: CUDA work is waited for)."""
    cuda = device is not None and device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for mb in batches:
        logp, _ = policy(mb if device is None else mb.to(device))
        (-logp.sum()).backward()
    if cuda:
        torch.cuda.synchronize(device)
    policy.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def _nbytes(x) -> int:
    """Bytes of every tensor a mask object keeps (a TreePlan, its FlexTree, a BlockMask)."""
    if torch.is_tensor(x):
        return x.nbytes
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    if hasattr(x, "__dict__"):
        return sum(_nbytes(v) for k, v in vars(x).items() if k != "mask_mod")
    return 0


def masks(args) -> None:
    """Mask memory and time: dense vs block mask from the dense mask vs mask_mod vs segments, at 8k and 32k tokens."""
    from clawgym.train.attention_flex import flex_block_mask

    policy = _tiny_policy(args)
    vocab = policy.lm.config.vocab_size
    # On CUDA every mask's forward + backward runs (the second of two runs: the first compiles FlexAttention's
    # kernels); on the CPU only the dense mask's at 8k, since FlexAttention has no CPU backward.
    cuda = torch.device("cuda") if torch.cuda.is_available() else None
    if cuda is not None:
        policy.lm.to(cuda)
    where = torch.cuda.get_device_name(cuda) if cuda is not None else f"{args.threads} threads"
    table = Table(title=f"tree masks on a GRPO-like tree (prefix L/2, 8 answers), tiny model, {where}")
    for col in ("tokens", "mask", "mask MiB", "vs dense", "build s", "fwd+bwd s"):
        table.add_column(col, justify="left" if col == "mask" else "right")
    for L in (8192, 32768):
        t = TreeMaker("m", random.Random(0), vocab)
        p = t.add(-1, L // 2, "env", "c0")
        for j in range(8):
            t.add(p, L // 16, "model", f"c{j}")
        tree = pack_tree(t.nodes)
        rows = {}
        for mode in ("dense", "block-mask", "mask_mod", "segments"):
            t0 = time.perf_counter()
            try:
                mb = collate([tree], [0], attention={"mask_mod": "flex", "segments": "segments"}.get(mode, "dense"))
                plan = mb.attention_mask
                if mode == "segments":
                    kept = _nbytes(plan)
                elif mode == "block-mask":
                    kept = _nbytes(plan.dense) + _nbytes(flex_block_mask(plan.dense))
                elif mode == "mask_mod":
                    kept = _nbytes(plan.flex.node) + _nbytes(plan.flex.last) + _nbytes(plan.flex.block_mask())
                else:
                    kept = _nbytes(plan.dense)
            except MemoryError:
                table.add_row(f"{L:,}", mode, "does not fit", "", "", "")
                continue
            build = time.perf_counter() - t0
            if cuda is not None and mode != "block-mask":
                _fwd_bwd_s(policy, [mb], cuda)
                step = f"{_fwd_bwd_s(policy, [mb], cuda):.3f}"
            elif cuda is not None:
                step = "as mask_mod (the same kernel)"
            elif mode in ("dense", "segments") and L <= 8192:
                step = f"{_fwd_bwd_s(policy, [mb]):.1f}"
            elif mode == "segments":
                step = "not run on CPU at this length"
            elif mode == "dense":
                step = "not run: SDPA's L² scores on CPU"
            else:
                step = "needs CUDA (no FlexAttention backward on CPU)"
            rows[mode] = kept
            table.add_row(f"{L:,}", mode, f"{kept / 2**20:.2f}", f"{kept / rows['dense']:.4f}x" if "dense" in rows else "",
                          f"{build:.2f}", step)
            del mb, plan
        table.add_section()
    Console(width=200).print(table)


def group(args) -> None:
    """A Claude-Code-like GRPO group, 8 rollouts sharing a 19k-token prompt: per-rollout trees vs one group trie."""
    from clawgym.train.trie import microbatches

    policy = _tiny_policy(args)
    vocab = policy.lm.config.vocab_size
    rng = random.Random(0)
    prompt = [rng.randrange(4, vocab) for _ in range(int(19_000 * args.scale))]
    trees = []
    for r in range(8):
        t = TreeMaker(f"g{r}", rng, vocab)
        x = t.add(-1, len(prompt), "env", "c0", toks=prompt)
        for k in range(4):  # each rollout's own turns: a model call, then its tool output
            m = t.add(x, t.r(50, 150), "model", f"c{k}")
            x = t.add(m, t.r(100, 400), "env", f"c{k + 1}")
        trees.append(pack_tree(t.nodes))
    budget = max(args.budget, 65536)
    table = Table(title=f"8 rollouts sharing a {len(prompt):,}-token prompt: forward + backward, tiny model, "
                        f"{args.threads} threads, budget {budget:,}, median of {args.repeats}")
    for col in ("packing", "micro-batches", "tokens forwarded", "tokens vs trie", "wall s", "wall vs trie"):
        table.add_column(col, justify="left" if col == "packing" else "right")
    res = {}
    for name, share in (("per-rollout trees", False), ("group trie", True)):
        batches = [mb for _, mb in microbatches(trees, range(len(trees)), budget, "segments", share)]
        walls = [_fwd_bwd_s(policy, batches) for _ in range(args.repeats)]  # --repeats 0: tokens only
        res[name] = (len(batches), sum(mb.n_tokens for mb in batches), statistics.median(walls) if walls else math.nan)
        print(f"{name}: {res[name]}", flush=True)
    _, tok_trie, wall_trie = res["group trie"]
    for name, (n, tok, wall) in res.items():
        table.add_row(name, str(n), f"{tok:,}", f"{tok / tok_trie:.2f}x", f"{wall:.1f}", f"{wall / wall_trie:.2f}x")
    Console(width=200).print(table)


# ---------------------------------------------------------------------------------------------
# Harness-shaped steps (--harness): the whole step's rollouts, sharing a system prompt
# ---------------------------------------------------------------------------------------------


def claude_code_step(rng: random.Random, vocab: int, s: float, tasks: int = 4, k: int = 4) -> list[list[TreeNode]]:
    """N tasks × K rollouts: one ~6k-token system prompt + tool schemas for all, one task prompt per
    task, then 3–8 calls of model output and tool result; half the rollouts start a subagent, whose
    own ~2k-token system prompt is the same in every rollout."""
    def toks(n: int) -> list[int]:
        return [rng.randrange(4, vocab) for _ in range(max(1, int(n * s)))]

    system, sub_system = toks(6000), toks(2000)
    step = []
    for task in range(tasks):
        prompt = toks(300)
        for r in range(k):
            t = TreeMaker(f"cc{task}.{r}", rng, vocab)
            x = t.add(t.add(-1, 0, "env", "c0", toks=system), 0, "env", "c0", toks=prompt)
            calls = t.r(3, 8)
            for c in range(calls):
                out = t.add(x, t.r(int(40 * s) + 1, int(200 * s) + 1), "model", f"c{c}")
                if c == 1 and r % 2 == 0:  # a subagent: its own tree, same system prompt in every rollout
                    y = t.add(-1, 0, "env", f"sub{c}", "subagent", True, "subagent", toks=sub_system)
                    for j in range(2):
                        y = t.add(t.add(y, t.r(int(80 * s) + 1, int(200 * s) + 1), "env", f"sub{c}.{j}", "subagent", True, "subagent"),
                                  t.r(int(40 * s) + 1, int(120 * s) + 1), "model", f"sub{c}.{j}", "subagent", True, "subagent")
                x = t.add(out, t.r(int(100 * s) + 1, int(600 * s) + 1), "env", f"c{c + 1}")
            step.append(t.nodes)
    return step


def openclaw_step(rng: random.Random, vocab: int, s: float, tasks: int = 2, k: int = 4) -> list[list[TreeNode]]:
    """N tasks × K rollouts under a ~19k-token system prompt; midway each rollout's context is pruned:
    the next call starts again from the system prompt with the task and only the latest messages, so
    the tree branches right under the system prompt (the dropped messages end the first branch)."""
    def toks(n: int) -> list[int]:
        return [rng.randrange(4, vocab) for _ in range(max(1, int(n * s)))]

    system = toks(19000)
    step = []
    for task in range(tasks):
        prompt = toks(400)
        for r in range(k):
            t = TreeMaker(f"oc{task}.{r}", rng, vocab)
            root = t.add(-1, 0, "env", "c0", toks=system)
            x, recent = t.add(root, 0, "env", "c0", toks=prompt), []
            calls, prune_at = t.r(4, 8), 2
            for c in range(calls):
                if c == prune_at:  # dropped context: system + task + the last tool result, re-sent
                    x = t.add(root, 0, "env", f"c{c}", toks=prompt + recent)
                out = t.add(x, t.r(int(40 * s) + 1, int(200 * s) + 1), "model", f"c{c}")
                recent = toks(t.r(100, 800))
                x = t.add(out, 0, "env", f"c{c + 1}", toks=recent)
            step.append(t.nodes)
    return step


HARNESS_STEPS = {"claude-code": claude_code_step, "openclaw": openclaw_step}


def head_peak_bytes(T: int, V: int, H: int, chunk: int) -> int:
    """Peak resident-memory growth of one LM-head forward + backward (logprob and entropy of T tokens,
    vocabulary V, hidden H) with `chunk`-token chunks (0: the whole head), in a fresh process whose
    peak is reset (/proc/self/clear_refs) once its inputs and gradient buffers exist."""
    out = subprocess.run([sys.executable, __file__, "--head-mem", f"{T},{V},{H},{chunk}"], capture_output=True,
                         text=True, check=True)
    return int(out.stdout.split()[-1])


def _head_mem_child(spec: str) -> None:
    T, V, H, chunk = (int(x) for x in spec.split(","))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(V, H) * 0.02)  # [V, H]
    w.grad = torch.zeros_like(w)  # the weight's gradient exists already: it is not the head's cost
    hidden = torch.randn(T, H, requires_grad=True)  # [T, H]
    hidden.grad = torch.zeros_like(hidden)
    targets, coef = torch.randint(0, V, (T,)), torch.randn(T)

    # Warm-up on 2 rows: the first checkpointed call loads code lazily (tens of MB resident), which is not the head's.
    lp, _ = chunked_logprobs(lambda x: (x @ w.T).float(), hidden[:2].detach().requires_grad_(), targets[:2], 1, True)
    lp.sum().backward()
    del lp
    w.grad.zero_()
    peak_memory.reset()  # the peak (VmHWM) starts again at the current size
    base = peak_memory.status_bytes("VmRSS")
    logp, ent = chunked_logprobs(lambda x: (x @ w.T).float(), hidden, targets, chunk, with_entropy=True)
    (coef * logp).sum().backward()  # training's loss: the logprobs; the entropy is a metric
    print(peak_memory.status_bytes("VmHWM") - base)


@dataclass
class StepRun:
    """One way of running a harness step: its micro-batches and what they cost."""

    label: str
    batches: list  # (micro-batch, loss weights [T]) pairs
    cpu_s: list[float]

    @property
    def tokens(self) -> int:
        return sum(mb.n_tokens for mb, _ in self.batches)

    @property
    def max_trainable(self) -> int:
        return max(int(w.numel()) for _, w in self.batches)


def _step_runs(trees: list[PackedTree], budgets: list[int]) -> tuple[dict[tuple[str, int], list], dict]:
    """The step's micro-batches as the trainer plans them at each budget: group tries (trie.py) and the step
    prefix forwarded once (prefix.py, the prefix-run's ids and each micro-batch's rows in the second dict),
    and the baseline: the step's unique tokens (its trie, depth-first) cut into plain causal rows."""
    from clawgym.train import prefix
    from clawgym.train.trie import merge_trees, plan

    runs, extra = {}, {}
    unique = merge_trees(trees)
    n_scored = sum(t.n_trainable for t in trees)
    for budget in budgets:
        (with_prefix,), ids = prefix.plan_ranks(trees, [list(range(len(trees)))], budget)
        for key, planned, shared in ((("step", budget), plan(trees, range(len(trees)), budget), None),
                                     (("prefix", budget), with_prefix, ids)):
            runs[key] = [(collate(parts, range(len(parts))), torch.ones(sum(trees[i].n_trainable for i in rows)))
                         for rows, parts in planned]
            extra[key] = (shared, [rows for rows, _ in planned])
        rows = []
        for a in range(0, unique.n_tokens, budget):
            path = torch.arange(a, min(a + budget, unique.n_tokens))
            k = max(1, round(n_scored * path.numel() / unique.n_tokens))  # the same scored tokens, spread evenly
            chain = as_chain(unique, path, path[1:][:k])
            rows.append((collate([chain], [0]), torch.ones(chain.target_ids.numel())))
        runs[("plain", budget)] = rows
    return runs, extra


def _fwd_bwd_cpu(policy: PackedPolicy, batches, prefix_ids: torch.Tensor | None = None) -> float:
    """Process CPU seconds of forward + backward over the micro-batches, as training computes them (with
    `prefix_ids`: that prefix forwarded once first, its gradient sent back through it after the last)."""
    from clawgym.train.prefix import SharedPrefix

    c0 = time.process_time()
    shared = SharedPrefix(policy.backbone, prefix_ids, torch.device("cpu")) if prefix_ids is not None else None
    for mb, w in batches:
        if isinstance(mb.attention_mask, TreePlan) and mb.attention_mask.prefix_len:
            mb = shared.attach(mb)
        logp, _ = policy(mb, with_entropy=True)
        (-(w * logp).sum()).backward()
    if shared is not None:
        shared.backward()
    policy.zero_grad(set_to_none=True)
    return time.process_time() - c0


def _same_as_tries(policy: PackedPolicy, trees: list[PackedTree], runs, extra, budget: int) -> tuple[float, float]:
    """The step prefix's plan against the trie plan at `budget`: the largest logprob difference and the largest
    parameter-gradient difference relative to each gradient's scale (the bench's check of prefix.py)."""
    from clawgym.train.prefix import SharedPrefix

    logps, grads = [], []
    for key in (("step", budget), ("prefix", budget)):
        ids, rows = extra[key]
        shared = SharedPrefix(policy.backbone, ids, torch.device("cpu")) if ids is not None else None
        got = {}
        for (mb, _), r in zip(runs[key], rows):
            if isinstance(mb.attention_mask, TreePlan) and mb.attention_mask.prefix_len:
                mb = shared.attach(mb)
            logp, _ = policy(mb)
            sizes = [trees[i].n_trainable for i in r]
            (-(torch.cat([torch.linspace(0.5, 1.5, n) for n in sizes]) * logp).sum()).backward()  # a per-token signal
            got.update(zip(r, logp.detach().split(sizes)))
        if shared is not None:
            shared.backward()
        logps.append(torch.cat([got[i] for i in sorted(got)]))
        grads.append([p.grad.clone() for p in policy.parameters() if p.grad is not None])
        policy.zero_grad(set_to_none=True)
    grad_diff = max(float((a - b).abs().max() / a.abs().max().clamp_min(1e-12)) for a, b in zip(*grads))
    return float((logps[0] - logps[1]).abs().max()), grad_diff


def _smollm2_policy() -> PackedPolicy:
    """SmolLM2-135M-Instruct (`clawgym init-model --from smollm2-135m-instruct`, converted once and cached)."""
    from transformers import AutoModelForCausalLM

    from clawgym.models.pretrained import init_pretrained

    model_dir = Path(tempfile.mkdtemp()) / "smollm2"
    init_pretrained(model_dir, "smollm2-135m-instruct")
    return PackedPolicy(AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=implementation("segments"),
                                                             dtype=torch.float32))


def _same_scores(policy: PackedPolicy, batches, chunk: int) -> tuple[float, float, float]:
    """On the step's first micro-batch: the largest error of the logprobs and entropies of the whole
    head and of `chunk`-token chunks against the same logits in float64, and the largest difference
    of their parameter gradients relative to each gradient's scale (the bench's correctness check)."""
    from clawgym.train.packing import backbone_forward, head_logits

    mb, w = batches[0]
    with torch.no_grad():
        hidden = backbone_forward(policy.lm.base_model, mb)
        ref = torch.log_softmax(head_logits(policy.lm, hidden.reshape(-1, hidden.shape[-1])[mb.pred_index]).double(), -1)
        ref_lp, ref_ent = ref.gather(-1, mb.target_ids[:, None]).squeeze(-1), -(ref.exp() * ref).sum(-1)
    errs, grads = [], []
    for c in (0, chunk):
        policy.head_chunk = c
        logp, ent = policy(mb, with_entropy=True)
        (-(w * logp).sum()).backward()
        errs.append(max(float((logp.detach() - ref_lp).abs().max()), float((ent.detach() - ref_ent).abs().max())))
        grads.append([p.grad.clone() for p in policy.parameters() if p.grad is not None])
        policy.zero_grad(set_to_none=True)
    grad_diff = max(float((a - b).abs().max() / a.abs().max().clamp_min(1e-12)) for a, b in zip(*grads))
    return errs[0], errs[1], grad_diff


def harness(args) -> int:
    """Harness-shaped steps, before (trainer's plan, whole LM head) and after (chunked head, and the
    larger micro-batches the freed memory buys): tokens forwarded / unique, step time / a plain causal
    pass over the unique tokens, LM-head peak memory per trainable token. Returns the exit code."""
    from clawgym.train.trie import merge_trees

    chunk = args.head_chunk
    models = []
    if "tiny" in args.models.split(","):
        models.append(("tiny", _tiny_policy(args), args.scale, args.budget))
    if "smollm2" in args.models.split(","):
        # A reduced shape on a shared CPU: SmolLM2's forward and backward cost ~0.8 GFLOP per token.
        models.append(("smollm2-135m", _smollm2_policy(), args.smollm2_scale, max(256, int(args.budget * args.smollm2_scale))))
    table = Table(title=f"harness-shaped steps: forward + backward of the whole step, {args.threads} thread(s), "
                        f"median of {args.repeats} (process CPU s), head chunk {chunk}")
    for col in ("model", "shape (scale)", "run", "micro-batches", "forwarded / unique", "step s", "step / plain causal",
                "head B / trainable tok", "head vs before"):
        table.add_column(col, justify="left" if col in ("model", "shape (scale)", "run") else "right")
    checks, prefix_checks = [], []
    for mname, policy, scale, b0 in models:
        V, H = policy.lm.config.vocab_size, policy.lm.config.hidden_size
        for shape, make in HARNESS_STEPS.items():
            trees = [pack_tree(n) for n in make(random.Random(0), V, scale)]
            whole = merge_trees(trees)
            unique = whole.n_tokens
            root_pairs = int((whole.position_ids + 1).sum())  # what exact attention needs: each token over its root path
            # The budget the whole head's memory holds with the chunked head, for the full-size step (a
            # reduced step scales it like its tokens: the chunk's fixed memory does not shrink with it).
            frac = sum(t.n_trainable for t in trees) / unique
            b1 = max(b0, int(same_memory_budget(policy.lm.config, round(b0 / scale), frac, chunk) * scale))
            runs, extra = _step_runs(trees, [b0, b1])
            checks.append((f"{mname} {shape}", *_same_scores(policy, runs[("step", b0)], chunk)))
            prefix_checks.append((f"{mname} {shape}", *_same_as_tries(policy, trees, runs, extra, b0)))
            configs = [(f"before: budget {b0:,}, whole head", ("step", b0), 0), (f"after: budget {b0:,}, chunked", ("step", b0), chunk),
                       (f"after: budget {b1:,} (same memory), chunked", ("step", b1), chunk),
                       (f"step prefix: budget {b0:,}, chunked", ("prefix", b0), chunk),
                       (f"step prefix: budget {b1:,}, chunked", ("prefix", b1), chunk)]
            cpu: dict = {}
            for _ in range(args.repeats):  # interleaved, so load from other processes hits every run alike
                for label, key, c in configs + [("plain", ("plain", b0), chunk), ("plain", ("plain", b1), chunk)]:
                    policy.head_chunk = c
                    cpu.setdefault((label, key), []).append(_fwd_bwd_cpu(policy, runs[key], extra.get(key, (None,))[0]))
            head_before = None
            for label, key, c in configs:
                batches = runs[key]
                ids = extra[key][0]
                forwarded = sum(mb.n_tokens for mb, _ in batches) + (ids.numel() if ids is not None else 0)
                T = max(int(w.numel()) for _, w in batches)
                head = head_peak_bytes(T, V, H, c) / T if not args.small else math.nan
                head_before = head if head_before is None else head_before
                step_s = statistics.median(cpu[(label, key)])
                plain_s = statistics.median(cpu[("plain", ("plain", key[1]))])
                table.add_row(mname, f"{shape} ({scale:g})", label, str(len(batches)),
                              f"{forwarded / unique:.2f}", f"{step_s:.2f}", f"{step_s / plain_s:.2f}x",
                              "not measured" if args.small else f"{head:,.0f}",
                              f"{head_before / head:.1f}x lower" if not args.small and head != head_before else "")
                n = ids.numel() if ids is not None else 0
                pairs = sum(attention_pairs(mb) for mb, _ in batches) + n * (n + 1) // 2
                plain_pairs = sum(attention_pairs(mb) for mb, _ in runs[("plain", key[1])])
                console_log(f"{mname} {shape} {label}: unique {unique:,}, forwarded {forwarded:,}, "
                            f"step {step_s:.2f} s, plain {plain_s:.2f} s, head {head:,.0f} B/token at {T:,} trainable tokens; "
                            f"attention pairs {pairs / 1e6:,.1f}M, plain {plain_pairs / 1e6:,.1f}M, "
                            f"every unique token over its root path {root_pairs / 1e6:,.1f}M")
            table.add_section()
    Console(width=220).print(table)
    if not args.small:
        head_only(args, chunk, [(m, p.lm.config.vocab_size, p.lm.config.hidden_size) for m, p, _, _ in models])
    ok = True
    for name, whole_err, part_err, grad_diff in checks:
        # The chunked head must be as exact as the whole one (fp32 against float64), with the same gradients.
        good = part_err <= whole_err + 1e-6 and grad_diff <= 1e-4
        ok &= good
        print(f"{name}: logprob/entropy error vs float64: whole head {whole_err:.1e}, chunked {part_err:.1e}; "
              f"gradients differ by {grad_diff:.1e} of their scale " + ("(ok)" if good else "(WRONG)"))
    for name, logp_diff, grad_diff in prefix_checks:
        # The step prefix forwarded once must score and back-propagate as the tries do (fp32).
        good = logp_diff <= 1e-5 and grad_diff <= 1e-5
        ok &= good
        print(f"{name}: step prefix vs tries: logprobs differ by {logp_diff:.1e}, gradients by {grad_diff:.1e} of their scale "
              + ("(ok)" if good else "(WRONG)"))
    return 0 if ok else 1


def same_memory_budget(config, budget: int, trainable_fraction: float, chunk: int) -> int:
    """The token budget whose micro-batch fits, with the chunked head, in the memory that `budget` needs
    with the whole head (clawgym.train.memory: bf16, activation checkpointing, as on a GPU), in 256s."""
    from clawgym.train import memory

    shape = memory.shape_of(config)
    whole, part = memory.estimate(shape, head_chunk=0), memory.estimate(shape, head_chunk=chunk)
    need = budget * (whole.act_per_token + trainable_fraction * whole.head_per_trainable_token)
    fits = (need - part.head_fixed) / (part.act_per_token + trainable_fraction * part.head_per_trainable_token)
    return max(budget, int(fits) // 256 * 256)


def head_only(args, chunk: int, shapes: list[tuple[str, int, int]]) -> None:
    """LM-head peak memory alone at 1k and 4k trainable tokens, SmolLM2's vocabulary (49,152) included."""
    if not any(V == 49152 for _, V, _ in shapes):
        shapes = shapes + [("smollm2-135m shape", 49152, 576)]
    table = Table(title="LM head alone: peak resident memory of logprob + entropy forward and backward, per trainable token")
    for col in ("head", "vocab", "trainable tokens", "whole head B/token", f"chunked ({chunk}) B/token", "lower by"):
        table.add_column(col, justify="left" if col == "head" else "right")
    for name, V, H in shapes:
        for T in (1024, 4096):
            whole, part = head_peak_bytes(T, V, H, 0) / T, head_peak_bytes(T, V, H, chunk) / T
            table.add_row(name, f"{V:,}", f"{T:,}", f"{whole:,.0f} ({whole / V:.1f} B × V)", f"{part:,.0f}", f"{whole / part:.1f}x")
    Console(width=220).print(table)


def console_log(msg: str) -> None:
    print(msg, flush=True)


def main() -> int:
    if sys.argv[1:2] == ["--head-mem"]:  # a head_peak_bytes child
        _head_mem_child(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="correctness only, in seconds: tiny harness-shaped steps")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is steadiest on a shared machine)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget", type=int, default=8192, help="padded tokens per micro-batch")
    ap.add_argument("--model", type=Path, default=None, help="policy dir (default: a fresh tiny init-model)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of " + ", ".join(SHAPES))
    ap.add_argument("--scale", type=float, default=None, help="tree size factor (default 1, or 0.5 with --small)")
    ap.add_argument("--lora-rank", type=int, default=0, help="compare full fine-tuning with LoRA of this rank instead")
    ap.add_argument("--lora-targets", default="all-linear", help="LoRA: modules to adapt")
    ap.add_argument("--masks", action="store_true", help="compare dense / block-mask / mask_mod tree masks at 8k and 32k tokens")
    ap.add_argument("--group", action="store_true", help="compare per-rollout trees with one group trie (8 rollouts, 19k shared)")
    ap.add_argument("--harness", action="store_true", help="Claude-Code- and OpenClaw-shaped steps, before/after the chunked head")
    ap.add_argument("--head-chunk", type=int, default=HEAD_CHUNK, help="--harness: LM-head chunk of the 'after' runs")
    ap.add_argument("--models", default="tiny", help="--harness: tiny and/or smollm2 (SmolLM2-135M-Instruct, "
                                                     "converted once and cached), comma-separated")
    ap.add_argument("--smollm2-scale", type=float, default=0.02, help="--harness: SmolLM2's (reduced) step size factor")
    args = results_md.parse(ap)
    torch.set_num_threads(args.threads)
    if args.small:  # tiny steps (a 180-token system prompt), one round, no subprocess measurements
        args.scale, args.repeats, args.budget, args.models = args.scale or 0.03, 1, 256, "tiny"
        return harness(args)
    args.scale = args.scale if args.scale is not None else 1.0
    if args.harness:
        args.repeats = min(args.repeats, 2)
        return harness(args)
    if args.lora_rank:
        lora_vs_full(args)
        return 0
    if args.masks:
        masks(args)
        return 0
    if args.group:
        args.repeats = min(args.repeats, 3)
        group(args)
        return 0
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    model_dir = args.model
    if model_dir is None:
        from clawgym.models.tiny import init_model

        model_dir = Path(tempfile.mkdtemp()) / "tiny"
        init_model(model_dir, seed=0, size="tiny")
    lm = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    policy = PackedPolicy(lm)
    vocab = lm.config.vocab_size
    scale = args.scale

    table = Table(title=f"forward+backward on {model_dir.name} ({sum(p.numel() for p in lm.parameters()):,} params), "
                        f"{args.threads} threads, median of {args.repeats}, budget {args.budget}")
    for col in ("shape", "mode", "tokens", "vs tree", "attn pairs", "wall ms", "cpu ms", "tree speedup (wall)",
                "tree speedup (cpu)", "saved MiB"):
        table.add_column(col, justify="left" if col in ("shape", "mode") else "right")
    console = Console(width=200)
    for name in args.shapes.split(","):
        make, n_trees = SHAPES[name]
        rng = random.Random(0)
        rollouts = [make(f"{name}{i}", rng, vocab, scale) for i in range(n_trees)]
        modes = {}
        for mode in ("tree", "tree-dense", "per-traj", "per-call"):
            trees, weights = [], []
            for nodes in rollouts:
                t, w = samples(nodes, mode)
                trees += t
                weights += w
            modes[mode] = Mode(policy, trees, weights, "dense" if mode == "tree-dense" else "segments", args.budget)
        # Interleaved rounds, so that load from other processes hits every mode alike.
        for r in range(1 + args.repeats):
            for m in modes.values():
                m.step(record=r > 0)
        results = {mode: m.result() for mode, m in modes.items()}
        base = results["tree"]
        for mode, r in results.items():
            console.log(f"{name} {mode}: {r}")
            table.add_row(name, mode, f"{r.tokens:,}", f"{r.tokens / base.tokens:.2f}x", f"{r.pairs / 1e6:.2f}M",
                          f"{r.wall_ms:.0f}", f"{r.cpu_ms:.0f}", f"{r.wall_ms / base.wall_ms:.2f}x",
                          f"{r.cpu_ms / base.cpu_ms:.2f}x", f"{r.saved_mib:.0f}")
        table.add_section()
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
