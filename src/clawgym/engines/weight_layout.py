"""An opt-in storage of the hf engine's linear weights on a CPU, for one-row decode steps (`weight_layout=decode`).

A decode step multiplies one row per sequence by every weight matrix: a matrix-vector product, bound
by how fast the weights stream from memory. `nn.Linear` keeps its weight as [out, in] rows, so
y = W x is a dot product per output. For a matrix with more outputs than inputs (the MLP's gate and
up projections, the LM head), the same product over the weight stored the other way round, [in, out]
rows, is a sum of scaled rows, which MKL's fp32 kernel ran faster at one row on the x86-64 machine
we measured, and slower at 4-8 rows (a GRPO group decoding side by side); for square or narrow
matrices it gained nothing (docs/results.md, `python3 bench/decode_speed.py --model
smollm2-135m-instruct`). So the engine keeps the checkpoint's layout unless
`weight_layout=decode` is asked for (a server that mostly decodes one request at a time).
`python3 bench/decode_speed.py` runs the engine both ways and prints each weight shape's one-row
rate in both layouts, so the trade can be checked on another machine.

`transpose_for_decode` re-stores the weights the rule picks: the parameter becomes a view `Wt.t()`
of a contiguous [in, out] tensor, so every value, shape and module is unchanged (an `nn.Linear`
still computes x Wᵀ, which is now x times a contiguous matrix); only the order in which the BLAS
kernel sums products can differ, which moves logits by float rounding, as batching does. A weight
tied to the input embeddings (SmolLM2's LM head) is re-stored once and the embedding reads its rows
from the same tensor, strided. Nothing is copied twice: memory stays what the checkpoint takes.
"""

from __future__ import annotations

from typing import Any


def decode_layout_wanted(out_features: int, in_features: int) -> bool:
    """Whether a weight of this shape streams faster in [in, out] storage for a one-row product."""
    return out_features > in_features


def transpose_for_decode(model: Any) -> int:
    """Re-store the weights of `model`'s plain `nn.Linear` layers that `decode_layout_wanted` picks
    (in place). Returns how many distinct weight tensors were re-stored."""
    import torch

    done: dict[int, torch.nn.Parameter] = {}  # id of the original parameter -> its re-stored one
    for module in model.modules():
        if type(module) is not torch.nn.Linear:  # quantized or adapter layers keep their own layout
            continue
        w = module.weight
        if id(w) in done:
            module.weight = done[id(w)]
            continue
        if not w.is_floating_point() or w.device.type != "cpu" or not decode_layout_wanted(*w.shape) or not w.is_contiguous():
            continue
        done[id(w)] = torch.nn.Parameter(w.detach().t().contiguous().t(), requires_grad=w.requires_grad)
        module.weight = done[id(w)]
    if done:  # a tied input embedding shares the head's tensor (one copy in memory, as in the checkpoint)
        emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        if emb is not None and id(emb.weight) in done:
            emb.weight = done[id(emb.weight)]
    return len(done)
