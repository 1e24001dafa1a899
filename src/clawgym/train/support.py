"""Which model architectures the tree path trains: config checks before any work, then a self-test.

Tree attention (attention.py) is exact for a decoder whose layers attend with softmax attention
over position-encoded keys, optionally in a sliding window or soft-capped. Two things are checked:

- `check_config`, from `config.json` alone, before the batch is scored: encoder-decoders, and
  layer kinds other than full or sliding-window attention (linear attention, state-space or
  convolution layers carry a state along the sequence, which a packed tree would leak from one
  branch into its sibling) are refused with one line naming the architecture.
- `self_test`, once the model is loaded: a small branched tree is forwarded packed and each of its
  root-to-leaf paths alone; the hidden states (and, for a causal LM, the logits the trainer
  computes) must agree. This catches what no config field says — a model class that does not pass
  keyword arguments down to its attention layers, position biases folded into the mask (ALiBi),
  logit post-processing the trainer does not reproduce — at the cost of a few tiny forwards.

docs/models.md has the table of architectures tested on CPU.
"""

from __future__ import annotations

import torch

from clawgym.artifacts import TreeNode
from clawgym.errors import UserError
from clawgym.train.attention import TreePlan
from clawgym.train.packing import backbone_forward, collate, head_logits, pack_tree, root_paths

ATTENTION_LAYERS = ("full_attention", "sliding_attention")
TOLERANCE = 1e-4  # fp32 packed vs per-path differ by ~1e-6; a wrong mask or a missing scale by far more


def _name(config) -> str:
    return getattr(config, "model_type", None) or type(config).__name__


def sliding_window(config) -> int | None:
    """The window of the model's sliding-window layers, or None if every layer attends fully."""
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    kinds = getattr(config, "layer_types", None)
    return window if kinds is None or "sliding_attention" in kinds else None


def check_config(config) -> None:
    """Refuse, in one line, an architecture the tree path would train wrongly."""
    name = _name(config)
    if getattr(config, "is_encoder_decoder", False):
        raise UserError(f"{name}: an encoder-decoder model; clawgym trains decoder-only causal LMs")
    other = sorted({k for k in (getattr(config, "layer_types", None) or []) if k not in ATTENTION_LAYERS})
    if other:
        raise UserError(f"{name}: has {', '.join(other)} layers, whose state runs along the sequence across a "
                        f"packed tree's branches; only full or sliding-window attention layers can be trained on trees")


def _probe_tree(vocab: int) -> list[TreeNode]:
    """A root, two branches and a grandchild: every kind of block segment attention builds."""
    tok = lambda *xs: [3 + x % (vocab - 3) for x in xs]  # noqa: E731 - ids above the usual special ids
    return [
        TreeNode("probe", 0, -1, tok(11, 12, 13, 14, 15), "env", [], "c0", 0, "main", True, 0),
        TreeNode("probe", 1, 0, tok(21, 22, 23), "model", [0.0] * 3, "c0", 0, "main", True, 5),
        TreeNode("probe", 2, 1, tok(31, 32), "env", [], "c1", 0, "main", True, 8),
        TreeNode("probe", 3, 0, tok(41, 42, 43, 44), "model", [0.0] * 4, "c2", 0, "main", True, 5),
    ]


@torch.no_grad()
def self_test(model: torch.nn.Module, attention: str) -> None:
    """Packed-tree outputs of `model` (a causal LM or a bare decoder) must equal its per-path outputs."""
    is_lm = model.get_output_embeddings() is not None
    body = model.base_model if is_lm else model
    tree = pack_tree(_probe_tree(model.config.vocab_size), only_trainable=False)
    device = next(model.parameters()).device
    mb = collate([tree], [0], attention=attention).to(device)
    name = _name(model.config)
    try:
        packed = backbone_forward(body, mb)[0]  # [N, H]
    except Exception as e:  # noqa: BLE001 - any failure here means the architecture is not supported
        raise UserError(f"{name}: cannot run on the tree path ({type(e).__name__}: {e})") from None
    plan: TreePlan = mb.attention_mask
    if plan.uses == 0:
        raise UserError(f"{name}: its layers do not receive keyword arguments from the model's forward, so tree "
                        f"attention never runs; this architecture cannot be trained on the tree path")
    worst = 0.0
    for path in root_paths(tree):
        ids = tree.input_ids[path][None].to(device)
        alone = body(input_ids=ids, use_cache=False).last_hidden_state[0]
        h = packed[path.to(device)]
        worst = max(worst, float((h - alone).abs().max() / alone.abs().max().clamp_min(1.0)))
        if is_lm:
            want = model(input_ids=ids, use_cache=False).logits[0].float()
            got = head_logits(model, h)
            if float((got - want).abs().max()) > TOLERANCE * float(want.abs().max().clamp_min(1.0)):
                raise UserError(f"{name}: its forward post-processes logits in a way the trainer does not reproduce; "
                                f"this architecture cannot be trained on the tree path")
    if worst > TOLERANCE:
        raise UserError(f"{name}: packed-tree attention does not reproduce per-path outputs (relative |Δ| {worst:.1e}); "
                        f"this architecture cannot be trained on the tree path")
