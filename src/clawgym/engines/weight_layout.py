"""How the hf engine stores its linear weights on a CPU (`weight_layout`): packed for oneDNN, or as loaded.

A decode step multiplies a handful of rows (one per sequence in the batch) by every weight matrix, so
it is bound by how fast the weights stream from memory. `nn.Linear` hands its [out, in] weight to the
BLAS fp32 kernel on every call, and for a few rows (one decode step, or a GRPO group decoding side
by side) that kernel streams the weights below the machine's read bandwidth. oneDNN, which torch
ships and uses for its own compiled CPU graphs, can reorder a weight once into a blocked layout its
kernel streams faster at any number of rows, prefill chunks included (the bench prints each weight
shape's rate at 1 and 8 rows, plain and packed: docs/results.md, `python3 bench/decode_speed.py
--model smollm2-135m-instruct`).

`weight_layout=packed` (the default where torch has oneDNN) does that reorder when the engine loads
or reloads weights: each plain fp32 `nn.Linear` on the CPU, past a size where oneDNN's fixed cost per
call would outweigh the faster read (`PACK_MIN`, `ONE_ROW_MIN`), keeps its parameter untouched (state dict,
tied embeddings and anything else that reads the weight see the checkpoint) and gains a packed copy
its forward multiplies by. The cost is memory: one more copy of the linear weights, the engine's own
(the trainer loads its model separately). `weight_layout=rows` keeps only the loaded weights, for a
machine short of memory or a torch built without oneDNN.

Exactness: the packed product sums the same terms in another order, which moves logits by float
rounding, as batching does; the engine's tests compare its logprobs with the checkpoint's. A forward
with autograd on (a test scoring through the engine's model) takes the plain path, as packing has
no backward. If the packed product of a layer does not match the plain one on probe rows (a torch
build whose oneDNN ops behave differently), the engine unpacks every layer and says so once.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

log = logging.getLogger(__name__)

WEIGHT_LAYOUTS = ("packed", "rows")
"""`packed`: each linear weight also held in oneDNN's blocked layout; `rows`: as loaded."""

PACK_ROWS = 8
"""The row count oneDNN picks its blocked format for: a GRPO group's decode step. The packed weight
serves any row count (prefill chunks ran faster than the plain path too)."""

PACK_MIN = 1 << 16
"""Weights with fewer elements stay plain: a oneDNN call costs more than their product saves."""

ONE_ROW_MIN = 1 << 19
"""A one-row product (batch-1 decode) goes through the packed copy only for weights at least this big:
below it the call's fixed cost outweighs the faster read. The bench prints each shape's rates."""


@functools.cache
def _packed_linear_class() -> type:
    import torch

    class PackedLinear(torch.nn.Linear):
        """An `nn.Linear` that multiplies by `packed_weight` (its weight in oneDNN's layout) when no gradient is wanted."""

        packed_weight: Any

        def forward(self, x):
            if (torch.is_grad_enabled() or x.dtype != self.weight.dtype
                    or (x.numel() == self.in_features and self.weight.numel() < ONE_ROW_MIN)):
                return torch.nn.functional.linear(x, self.weight, self.bias)
            return packed_product(x, self.packed_weight, self.bias)

    return PackedLinear


def pack(weight: Any) -> Any:
    """`weight` ([out, in], fp32, CPU) reordered once into oneDNN's blocked layout for `packed_product`."""
    import torch

    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


def packed_product(x: Any, packed: Any, bias: Any = None) -> Any:
    """x Wᵀ + bias for a weight `pack` reordered: [..., in] -> [..., out], no backward."""
    import torch

    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def available() -> bool:
    """Whether this torch can pack weights for oneDNN (built with it, and the ops are there)."""
    import torch

    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def pack_linears(model: Any) -> int:
    """Give each plain fp32 `nn.Linear` on the CPU in `model` a oneDNN-packed copy of its weight (in place)
    and multiply by it; returns how many layers were packed (0 where this torch cannot, logged once)."""
    import torch

    if not available():
        log.info("hf engine: this torch has no oneDNN weight packing; linear weights stay as loaded")
        return 0
    cls = _packed_linear_class()
    packed: dict[int, Any] = {}  # id of a weight -> its packed copy (a weight shared by two layers is packed once)
    layers = []
    with torch.no_grad():
        for module in model.modules():
            w = module.weight if type(module) is torch.nn.Linear else None
            if w is None or w.device.type != "cpu" or w.dtype != torch.float32 or w.numel() < PACK_MIN:
                continue  # quantized, adapter, half-precision, GPU and small layers keep their own path
            try:
                if id(w) not in packed:
                    packed[id(w)] = pack(w)
            except RuntimeError as e:  # a shape or build oneDNN refuses: the whole model stays plain
                unpack(model)
                log.warning("hf engine: oneDNN could not pack a %s weight (%s); linear weights stay as loaded",
                            tuple(w.shape), str(e).splitlines()[0] if str(e) else type(e).__name__)
                return 0
            module.packed_weight = packed[id(w)]
            module.__class__ = cls
            layers.append(module)
        if layers and not _agrees(layers[-1]):
            unpack(model)
            log.warning("hf engine: oneDNN's packed product disagrees with the plain one on this torch; "
                        "linear weights stay as loaded")
            return 0
    return len(layers)


def unpack(model: Any) -> None:
    """Undo `pack_linears`: every packed layer is a plain `nn.Linear` again, the packed copies freed."""
    import torch

    cls = _packed_linear_class()
    for module in model.modules():
        if type(module) is cls:
            module.__class__ = torch.nn.Linear
            del module.packed_weight


def _agrees(module: Any) -> bool:
    """Whether the packed product of `module` matches the plain one on a few random rows (float rounding)."""
    import torch

    x = torch.randn(PACK_ROWS, module.in_features, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        plain = torch.nn.functional.linear(x, module.weight, module.bias)
        got = module(x)
    return bool(torch.allclose(got, plain, rtol=1e-4, atol=1e-4 * float(plain.abs().max())))
