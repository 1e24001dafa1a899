"""Training memory per GPU from a model's shape: weights, gradients, optimizer, activations per token.

`estimate` is the formula (docs/training.md explains each term and prints its table with
`python -m clawgym.train.memory`); `train` prints `estimate_line` once when it starts.

- weights: P × 4 B (fp32) or 2 B (bf16); under LoRA the frozen base the same, the adapters extra.
- gradients: trainable parameters × the weights' bytes.
- optimizer: AdamW's two moments in fp32, 8 B per trainable parameter, plus a 4 B fp32 master
  copy when the weights are bf16 (an update of 1e-5 relative is below bf16's resolution).
- FSDP over G ranks (FULL_SHARD) divides all three by G and adds two gathered decoder layers
  (the one computing and the one prefetched).
- activations per token (bf16, flash/SDPA attention): each decoder layer keeps its input, norm
  outputs, q/k/v, the attention output and the MLP's gate/up/act/product, 4h + 2·q + 2·kv + 4·ffn
  elements; activation checkpointing keeps only the layer input (h) and recomputes one layer at a time.
- the LM head runs on trainable tokens only (packing.py), `head_chunk` of them at a time
  (lm_head.py): one chunk's vocabulary tensors (bf16 and fp32 logits and the backward's two fp32
  buffers, 16 B × vocab per row; docs/results.md, `python3 bench/train.py --harness`, has it measured) and one weight-sized
  gradient of the chunk beside the summed one, per micro-batch whatever its length; per trainable
  token only the hidden row the chunk is recomputed from (4 B × hidden) and its results.
  Unchunked (`head_chunk` 0): bf16 logits, fp32 logits, log-softmax and its exp, 14 B × vocab per
  trainable token.

Not counted, since the formula is for the GPU's attention: segment attention (the CPU default,
attention.py) also keeps, in every layer and for every block of up to 512 queries of a branch
under ancestors, SDPA's float copy of the block's mask (its queries × its keys) and a copy of the
keys and values it attends to (ancestors included, grouped-query heads repeated).
"""

from __future__ import annotations

from dataclasses import dataclass

from clawgym.train.config import HEAD_CHUNK

GIB = 1024**3


@dataclass(frozen=True)
class Shape:
    """What the formula needs of a decoder-only transformer."""

    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool


@dataclass(frozen=True)
class Estimate:
    """Bytes per GPU; activations and head bytes are per token, `head_fixed` per micro-batch."""

    params: int
    trainable: int
    weights: float
    grads: float
    optimizer: float
    act_per_token: float
    head_per_trainable_token: float
    head_fixed: float = 0.0  # the chunked head's one chunk (+ weight-sized gradient), whatever the tokens

    @property
    def static(self) -> float:
        return self.weights + self.grads + self.optimizer

    def max_tokens(self, gpu_bytes: float, trainable_fraction: float = 0.25, headroom: float = 0.9) -> int:
        """Tokens per micro-batch that fit beside the static memory (0: the static part alone does not fit)."""
        per_token = self.act_per_token + trainable_fraction * self.head_per_trainable_token
        return max(0, int((gpu_bytes * headroom - self.static - self.head_fixed) / per_token))


# Qwen3 dense models (their published config.json shapes), for the docs table.
QWEN3 = {
    "0.6B": Shape(1024, 28, 3072, 16, 8, 128, 151936, True),
    "4B": Shape(2560, 36, 9728, 32, 8, 128, 151936, True),
    "8B": Shape(4096, 36, 12288, 32, 8, 128, 151936, False),
    "32B": Shape(5120, 64, 25600, 64, 8, 128, 151936, False),
}


def shape_of(config) -> Shape:
    """The Shape of a transformers config (text config of a multimodal one)."""
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = c.num_attention_heads
    return Shape(c.hidden_size, c.num_hidden_layers, c.intermediate_size, heads,
                 getattr(c, "num_key_value_heads", None) or heads,
                 getattr(c, "head_dim", None) or c.hidden_size // heads, c.vocab_size,
                 bool(getattr(c, "tie_word_embeddings", False)))


def _linears(s: Shape) -> list[tuple[int, int]]:
    """(in, out) of one decoder layer's linear maps: q, k, v, o, gate, up, down."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return [(s.hidden, q), (s.hidden, kv), (s.hidden, kv), (q, s.hidden),
            (s.hidden, s.ffn), (s.hidden, s.ffn), (s.ffn, s.hidden)]


def layer_params(s: Shape) -> int:
    return sum(i * o for i, o in _linears(s)) + 2 * s.hidden + 2 * s.head_dim  # + RMSNorms (incl. q/k norms)


def param_count(s: Shape) -> int:
    embed = s.vocab * s.hidden
    return s.layers * layer_params(s) + embed * (1 if s.tied else 2) + s.hidden


def lora_params(s: Shape, rank: int) -> int:
    """Adapter parameters of all-linear LoRA at `rank`: rank × (in + out) per adapted linear."""
    return s.layers * sum(rank * (i + o) for i, o in _linears(s))


def estimate(s: Shape, *, precision: str = "bf16", lora_rank: int = 0, fsdp: int = 1,
             activation_checkpointing: bool = True, head_chunk: int = HEAD_CHUNK) -> Estimate:
    """Per-GPU training memory of one policy (see the module docstring for each term)."""
    P = param_count(s)
    trainable = lora_params(s, lora_rank) if lora_rank else P
    wb = 4 if precision == "fp32" else 2
    weights = P * wb + (trainable * wb if lora_rank else 0)
    grads = trainable * wb
    optimizer = trainable * (8 + (4 if wb == 2 else 0))
    weights, grads, optimizer = weights / fsdp, grads / fsdp, optimizer / fsdp
    if fsdp > 1:
        weights += 2 * layer_params(s) * wb
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    full_layer = 2 * (4 * s.hidden + 2 * q + 2 * kv + 4 * s.ffn)  # bf16 bytes per token per layer
    act = 2 * s.hidden * s.layers + full_layer if activation_checkpointing else full_layer * s.layers
    if head_chunk <= 0:
        return Estimate(P, trainable, weights, grads, optimizer, act, 14 * s.vocab)
    head_grad = s.vocab * s.hidden * wb if trainable == P else 0  # LoRA leaves the LM head frozen
    return Estimate(P, trainable, weights, grads, optimizer, act, 4 * s.hidden + 8, 16 * s.vocab * head_chunk + head_grad)


def estimate_line(s: Shape, cfg, world: int) -> str:
    """One line for the start of training: what this run's policy needs per GPU."""
    shards = world if getattr(cfg, "fsdp", False) else 1
    e = estimate(s, precision=cfg.precision, lora_rank=cfg.lora_rank, fsdp=shards,
                 activation_checkpointing=cfg.activation_checkpointing, head_chunk=cfg.head_chunk)
    sharding = f"FSDP over {shards}" if shards > 1 else "unsharded"
    return (f"memory per process ({cfg.precision}, {world} process(es), {sharding}): {e.params / 1e9:.2f}B params, "
            f"weights {e.weights / GIB:.2f} GiB, grads {e.grads / GIB:.2f} GiB, optimizer {e.optimizer / GIB:.2f} GiB, "
            f"activations {e.act_per_token / 1024:.1f} KiB/token + {e.head_per_trainable_token / 1024:.0f} KiB/trainable token"
            + (f" + LM head {e.head_fixed / GIB:.2f} GiB per micro-batch ({cfg.head_chunk}-token chunks)" if e.head_fixed else ""))


def fit_table(gpus: dict[str, float], fsdp_ranks: int = 8, lora_rank: int = 64) -> str:
    """The docs' Markdown table: static GiB per GPU and max tokens per micro-batch, bf16 + checkpointing."""
    setups = [("full", 0, 1), (f"FSDP×{fsdp_ranks}", 0, fsdp_ranks), (f"LoRA r{lora_rank}", lora_rank, 1),
              (f"LoRA r{lora_rank} + FSDP×{fsdp_ranks}", lora_rank, fsdp_ranks)]
    head = "| model | setup | " + " | ".join(f"{g}: static GiB / max tokens" for g in gpus) + " |"
    rows = [head, "|" + "---|" * (2 + len(gpus))]
    for name, s in QWEN3.items():
        for label, r, g in setups:
            e = estimate(s, lora_rank=r, fsdp=g)
            cells = []
            for gb in gpus.values():
                n = e.max_tokens(gb * 1e9)
                cells.append(f"{e.static / GIB:.1f} / " + (f"{n:,}" if n else "does not fit"))
            rows.append(f"| Qwen3-{name} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(fit_table({"80 GB": 80, "141 GB": 141}))
