"""The hf engine's KV cache: rows joined and cut in place, and decode steps that append a column.

Every row's tokens sit right-aligned in the cache (left padding, masked out), so two batches join
by left-padding the narrower one's keys and values and concatenating rows, and a finished row is
cut with the leading columns only padding uses. Only plain full-attention layers (transformers'
`DynamicLayer`) can be joined and cut this way (`joinable`); their keys and values live in
buffers with room to grow (`GrowingLayer`), so a decode step writes one new column instead of
copying the whole cache.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


def cache_of(out: Any) -> Any:
    return out["cache"] if "cache" in out else out.past_key_values



def left_pad(t: Any, width: int, dim: int) -> Any:
    """`t` with zeros prepended along `dim` up to `width` (masked-out padding)."""
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)



def _growing_layer_class():
    class GrowingLayer(DynamicLayer):
        """A full-attention layer whose keys/values are views of buffers with room to grow: a decode step
        writes its one new column instead of copying the whole cache (`torch.cat` in DynamicLayer.update
        reads and writes every cached key and value on every step). A join or a cut of rows hands the layer
        new buffers (`into_buffers`); keys or values replaced any other way are copied into new buffers on
        the next update."""

        def adopt(self, kb, vb, n: int) -> None:
            """Take buffers [B, heads, capacity, head_dim] whose first `n` columns hold the keys/values."""
            self._kbuf, self._vbuf = kb, vb
            self.keys, self.values = kb[:, :, :n], vb[:, :, :n]

        def update(self, key_states, value_states, *args, **kwargs):
            n, add = self.keys.shape[-2], key_states.shape[-2]
            kb, vb = getattr(self, "_kbuf", None), getattr(self, "_vbuf", None)
            if not (kb is not None and kb.shape[0] == self.keys.shape[0] and kb.shape[-2] >= n + add
                    and self.keys.data_ptr() == kb.data_ptr() and self.values.data_ptr() == vb.data_ptr()
                    and self.keys.stride() == kb.stride() and self.values.stride() == vb.stride()):
                b, h, _, d = self.keys.shape
                cap = capacity(n + add)
                kb, vb = self.keys.new_empty((b, h, cap, d)), self.values.new_empty((b, h, cap, self.values.shape[-1]))
                kb[:, :, :n], vb[:, :, :n] = self.keys, self.values
                self._kbuf, self._vbuf = kb, vb
            kb[:, :, n:n + add], vb[:, :, n:n + add] = key_states, value_states
            self.keys, self.values = kb[:, :, :n + add], vb[:, :, :n + add]
            return self.keys, self.values

    return GrowingLayer


_GROWING: list = []


def capacity(n: int) -> int:
    """Columns to allocate for a cache of `n` columns: geometric growth, amortized one copy per token."""
    return n + max(64, n // 2)


def into_buffers(layer: Any, pieces: list[tuple[Any, Any]], width: int) -> None:
    """Make `layer` a GrowingLayer holding `pieces` (keys, values [rows, heads, t, head_dim]) stacked by
    rows, each right-aligned at column `width` after zeros (masked padding), in new buffers with room to
    grow: one copy of what is kept, and the next decode step appends in place."""
    if not _GROWING:
        _GROWING.append(_growing_layer_class())
    k0, v0 = pieces[0]
    rows = sum(k.shape[0] for k, _ in pieces)
    kb = k0.new_empty((rows, k0.shape[1], capacity(width), k0.shape[-1]))  # the room is written before it is read
    vb = v0.new_empty((rows, v0.shape[1], kb.shape[2], v0.shape[-1]))
    r = 0
    for k, v in pieces:
        n, t = k.shape[0], k.shape[2]
        kb[r:r + n, :, :width - t] = 0
        vb[r:r + n, :, :width - t] = 0
        kb[r:r + n, :, width - t:width] = k
        vb[r:r + n, :, width - t:width] = v
        r += n
    layer.__class__ = _GROWING[0]
    layer.adopt(kb, vb, width)


def growing(cache: Any) -> Any:
    """`cache` with its plain full-attention layers turned into GrowingLayers (in place)."""
    if not _GROWING:
        _GROWING.append(_growing_layer_class())
    cls = _GROWING[0]
    for layer in getattr(cache, "layers", []):
        if type(layer) is DynamicLayer and layer.is_initialized:
            layer.__class__ = cls  # same state; only update() differs
    return cache


def plain_attention(config: Any) -> bool:
    """Whether the model's own cache would hold plain full-attention layers only (known before a forward)."""
    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # a config transformers cannot build a cache from: the first prefill will tell
        return True
    return all(type(layer) is DynamicLayer for layer in layers)


def joinable(cache: Any) -> bool:
    """Whether batches with this cache can be joined and cut row-wise (plain full-attention layers only)."""
    layers = getattr(cache, "layers", None)
    ok = (DynamicLayer, *_GROWING)
    return bool(layers) and all(type(layer) in ok and layer.keys is not None for layer in layers)


