"""Generated task families: `clawgym tasks make FAMILY DST --count N --seed S --split train|heldout`.

A family draws native task folders (docs/tasks.md) from a seeded generator and knows how to solve
them: its `teach` method is the teacher's policy, given the instruction and the tool results so far
(the `teacher` engine serves it through the proxy, docs/engines.md). Families are looked up by name
in `FAMILIES`; adding one is a module with a class that follows `Family` plus one dict entry.

Train and held-out splits are disjoint by construction, not by luck of the seeds: every drawn task
has a content signature (what decides its answer), and the signature's hash alone decides which
split it may belong to (`split_of`). A generator for one split rejects draws that hash to the
other, so no seed of one split can produce a task of the other. The split name is also part of the
random stream's seed, so the two splits' draws are independent.
"""

from __future__ import annotations

import random
from pathlib import Path

from clawgym.errors import UserError
from clawgym.tasks.generated import MAX_DRAWS, SPLITS, Drawn, Family, split_of
from clawgym.tasks.lookup import LookupFamily
from clawgym.tasks.scan import ScanFamily
from clawgym.tasks.writer import write_task


FAMILIES: dict[str, Family] = {"lookup": LookupFamily(), "scan": ScanFamily()}


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise UserError(f"unknown task family '{name}'; choose one of: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def draw_tasks(family: str, n: int, seed: int, split: str) -> list[Drawn]:
    """`n` distinct tasks of `split`, categories taken in turn; the same arguments give the same tasks."""
    fam = get_family(family)
    if split not in SPLITS:
        raise UserError(f"--split must be one of {', '.join(SPLITS)}, got {split!r}")
    if n < 1:
        raise UserError(f"--count must be at least 1, got {n}")
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    rng = random.Random(f"{family}/{split}/{seed}")  # the split is part of the stream's seed
    out: list[Drawn] = []
    seen: set[str] = set()
    draws = 0
    while len(out) < n:
        i = len(out)
        category = fam.categories[i % len(fam.categories)]
        drawn = fam.draw(rng, category, f"{family}-{split}-{seed}-{i:03d}")
        draws += 1
        if split_of(drawn.signature) == split and drawn.signature not in seen:
            seen.add(drawn.signature)
            out.append(drawn)
        elif draws > MAX_DRAWS:
            raise UserError(f"family '{family}' has fewer than {n} distinct {split} tasks (drew {len(out)} in {draws} tries)")
    return out


def make_tasks(family: str, dst: Path, *, n: int, seed: int, split: str, force: bool = False) -> list[Path]:
    """Write `n` generated tasks into `dst` (one folder each, atomically); returns their folders."""
    drawn = draw_tasks(family, n, seed, split)
    dst = Path(dst)
    if not force:
        clash = [d.draft.id for d in drawn if (dst / d.draft.id).exists()]
        if clash:  # checked before writing any, so a refused call leaves DST as it was
            raise UserError(f"{dst / clash[0]}: already exists (pass --force to overwrite)")
    return [dst / write_task(d.draft, dst, force=force).id for d in drawn]
