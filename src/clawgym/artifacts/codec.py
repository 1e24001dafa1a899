"""The prompt delta codec: which earlier call a prompt is stored against, the stored delta, and the full prompt back.

A harness resends the whole conversation every turn, so storing full prompts is quadratic in the
number of turns. A call record may instead store its prompt as `prompt_base_call` + `prompt_base_len`
+ `prompt_ids` (the tail): the full prompt is the first `prompt_base_len` tokens of the base call's
prompt+output, then the tail (docs/architecture.md, "Delta-encoded prompts").

Encoding, one rule for every writer (`encode_prompt`):

- the candidates are the call whose conversation the prompt extends (the earlier call whose whole
  prompt the new prompt begins with: the longest such, the latest of equal ones) and the rollout's
  latest earlier call (which also covers a rewritten history: compaction, a dropped turn);
- the base is the candidate whose prompt+output shares the longest prefix with the prompt, the
  extended conversation on a tie, and `prompt_base_len` is that shared length;
- the prompt is stored as a delta only when it shares at least `MIN_SHARED_PREFIX` tokens, so a
  prompt is never tied to an unrelated call for a few tokens of template header.

The proxy knows the extended conversation without scanning: its renderer keys every request by its
messages and passes the call of the longest earlier request this one continues, with the tokens it
already knows are shared (proxy/render.py). `delta_encode_calls` finds it in full-prompt records by
comparing prompts. A base's output is what the encoder has seen of it: the proxy renders a request
while an earlier call may still be generating, so such a base counts with its prompt alone.

Decoding (`materialize_prompts`; the tree builder walks its tree instead but checks references with
`link_bases` and `check_base_len`): a base must be an earlier call (by seq) of the same rollout and
`prompt_base_len` at most its prompt+output; otherwise one ArtifactError naming file, call and field.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from clawgym.artifacts.rows import ArtifactError, CallRecord

MIN_SHARED_PREFIX = 16
"""a call's prompt is stored as a delta only when it shares at least this many tokens with its base"""


def common_prefix(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """How many leading tokens `a` and `b` share, given that the first `start` are known equal.

    Compared in growing vectorised chunks, so the cost follows the shared length rather than the
    prompt length (prompts run to tens of thousands of tokens; unrelated ones differ within a few).
    """
    n = min(len(a), len(b))
    i, step = min(start, n), 64
    while i < n:
        j = min(n, i + step)
        diff = np.flatnonzero(np.asarray(a[i:j]) != np.asarray(b[i:j]))
        if diff.size:
            return i + int(diff[0])
        i, step = j, step * 4
    return n


@dataclass(frozen=True)
class PromptBase:
    """An earlier call of the rollout a prompt may be stored against."""

    call_id: str
    prompt: Sequence[int]
    """its full prompt ids"""
    output: Sequence[int]
    """its sampled ids as far as the encoder has them (empty while the call is still generating)"""
    shared: int = 0
    """leading tokens of the new prompt the caller knows equal this prompt's (it built the new one on them)"""

    def shared_with(self, prompt: Sequence[int]) -> int:
        """How many leading tokens of `prompt` equal this call's prompt followed by its output."""
        k = common_prefix(self.prompt, prompt, self.shared)
        if k < len(self.prompt):
            return k
        return k + common_prefix(self.output, prompt[k:])


@dataclass(frozen=True)
class PromptDelta:
    """How one prompt is stored: against `base_call` (None: in full), sharing `base_len` tokens with it."""

    base_call: str | None = None
    base_len: int = 0

    def tail(self, prompt: Sequence[int]) -> list[int]:
        """The ids a record stores for `prompt` (docs/architecture.md, calls: `prompt_ids`)."""
        return list(prompt[self.base_len:])


def encode_prompt(prompt: Sequence[int], candidates: Iterable[PromptBase | None]) -> PromptDelta:
    """The delta of `prompt` by the module's rule; `candidates` in order of preference (extended
    conversation first, then the latest call; None for a candidate the rollout lacks)."""
    best, best_len = None, -1
    for base in candidates:
        if base is not None and (n := base.shared_with(prompt)) > best_len:
            best, best_len = base, n
    if best is None or best_len < MIN_SHARED_PREFIX:
        return PromptDelta()
    return PromptDelta(best.call_id, best_len)


def extended_call(prompt: Sequence[int], earlier: Sequence[PromptBase]) -> PromptBase | None:
    """The conversation `prompt` extends, found by comparing prompts: the earlier call whose whole
    prompt `prompt` begins with, the longest such, the latest of equal ones."""
    best = None
    for base in reversed(earlier):
        n = len(base.prompt)
        if n <= len(prompt) and (best is None or n > len(best.prompt)) and common_prefix(base.prompt, prompt) == n:
            best = base
    return dataclasses.replace(best, shared=len(best.prompt)) if best is not None else None


def delta_encode_calls(calls: Sequence[CallRecord]) -> list[CallRecord]:
    """Delta-encode full-prompt call records as the proxy records them; returned in (rollout, seq) order."""
    out: list[CallRecord] = []
    earlier: dict[str, list[PromptBase]] = {}
    for c in sorted(calls, key=lambda c: (c.rollout_id, c.seq)):
        if c.is_delta:
            raise ValueError(f"call {c.call_id!r} of rollout {c.rollout_id!r} is already delta-encoded; materialize_prompts first")
        prev = earlier.setdefault(c.rollout_id, [])
        delta = encode_prompt(c.prompt_ids, (extended_call(c.prompt_ids, prev), prev[-1] if prev else None))
        out.append(dataclasses.replace(c, prompt_ids=delta.tail(c.prompt_ids), prompt_base_call=delta.base_call,
                                       prompt_base_len=delta.base_len))
        prev.append(PromptBase(c.call_id, list(c.prompt_ids), list(c.output_ids)))
    return out


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------


def link_bases(rollout_id: str, calls: Sequence[tuple[str, int, str | None]], path: str | os.PathLike) -> list[int]:
    """For one rollout's (call_id, seq, prompt_base_call) in seq order: the index of each base call, or -1."""
    index: dict[str, int] = {}
    bases = []
    last_seq = None
    for i, (call_id, seq, base_call) in enumerate(calls):
        if seq == last_seq:
            raise ArtifactError(path, "seq", f"rollout {rollout_id!r} has two calls with seq {seq}")
        if call_id in index:
            raise ArtifactError(path, "call_id", f"rollout {rollout_id!r} has two calls with call_id {call_id!r}")
        if base_call is None:
            bases.append(-1)
        elif base_call in index:
            bases.append(index[base_call])
        else:
            raise ArtifactError(path, "prompt_base_call",
                                f"call {call_id!r} of rollout {rollout_id!r} refers to {base_call!r}, not an earlier call of that rollout")
        index[call_id] = i
        last_seq = seq
    return bases


def check_base_len(path: str | os.PathLike, where: str, base_len: int, base_call: str | None, base_total: int) -> None:
    """`prompt_base_len` fits its base: 0 without one, else at most the base's prompt+output (`base_total`).

    `where` names the call in the error, e.g. "call 'c1' (seq 1) of rollout 'r0'".
    """
    if base_call is None:
        if base_len != 0:
            raise ArtifactError(path, "prompt_base_len", f"{where} has prompt_base_len {base_len} but no prompt_base_call")
    elif not 0 <= base_len <= base_total:
        raise ArtifactError(path, "prompt_base_len",
                            f"{where} shares {base_len} tokens with call {base_call!r}, whose prompt+output has only {base_total}")


def materialize_prompts(calls: Sequence[CallRecord], path: str | os.PathLike = "<calls>") -> list[CallRecord]:
    """The calls with full `prompt_ids`, in (rollout, seq) order, every delta resolved within its rollout."""
    out = []
    ordered = sorted(calls, key=lambda c: (c.rollout_id, c.seq))
    for rollout_id, group in itertools.groupby(ordered, key=lambda c: c.rollout_id):
        group = list(group)
        bases = link_bases(rollout_id, [(c.call_id, c.seq, c.prompt_base_call) for c in group], path)
        full: list[list[int]] = []  # per call: prompt + output
        for c, b in zip(group, bases):
            where = f"call {c.call_id!r} (seq {c.seq}) of rollout {rollout_id!r}"
            check_base_len(path, where, c.prompt_base_len, c.prompt_base_call, len(full[b]) if b >= 0 else 0)
            prompt = (full[b][: c.prompt_base_len] if b >= 0 else []) + list(c.prompt_ids)
            full.append(prompt + list(c.output_ids))
            out.append(dataclasses.replace(c, prompt_ids=prompt, prompt_base_call=None, prompt_base_len=0))
    return out
