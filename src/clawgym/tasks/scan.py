"""The `scan` task family: read files one at a time until one shows an error, then name it.

Every task's workspace holds three small log files, `a.txt`, `b.txt` and `c.txt`, each with two
`key=digit` lines; exactly one of them also holds an `error` line. The instruction is always the
same, "One of a.txt, b.txt and c.txt has an error line. Write the name of that file to answer.txt.",
so what the agent must do depends only on what its tools show it: read a file, decide from what
it printed whether to stop or read the next, and write the name. The categories (the columns of
the per-category Pass@1 table) are where the error sits:

| category | error in | the teacher's calls |
|---|---|---|
| `first`  | a.txt | `cat a.txt`, write `a.txt` |
| `second` | b.txt | `cat a.txt`, `cat b.txt`, write `b.txt` |
| `third`  | c.txt | `cat a.txt`, `cat b.txt`, write `c.txt` (neither of the first two had it) |

Every task takes two or three tool calls and one or two decisions on a tool's output; the held-out
split holds file contents never trained on. The check gives partial credit: `answered`
(answer.txt exists and is not empty) and `correct` (its stripped text is the file's name), each
worth half.

Names are short on purpose: the keys, `cat`, `error` and the file names are one or two tokens of
the init-model tokenizer, so a small random model can learn the family with SFT and RL in minutes.
"""

from __future__ import annotations

import json
import random
import re

from clawgym.tasks.generated import Drawn, Reply, tool_call
from clawgym.tasks.lookup import ANSWER, CHECK_PY, KEYS
from clawgym.tasks.writer import TaskDraft

FILES = ("a.txt", "b.txt", "c.txt")
CATEGORIES = ("first", "second", "third")
"""the category is where the error sits: FILES[i] for CATEGORIES[i]"""
LINES_PER_FILE = 2
MARK = "error"
INSTRUCTION = "One of a.txt, b.txt and c.txt has an error line. Write the name of that file to answer.txt."


class ScanFamily:
    name = "scan"
    categories = CATEGORIES

    def draw(self, rng: random.Random, category: str, task_id: str) -> Drawn:
        holder = FILES[CATEGORIES.index(category)]
        files: dict[str, list[str]] = {}
        for f in FILES:
            lines = [f"{k}={rng.randint(1, 9)}" for k in rng.sample(KEYS, LINES_PER_FILE)]
            if f == holder:
                lines.insert(rng.randint(0, len(lines)), MARK)
            files[f] = lines
        draft = TaskDraft(
            id=task_id,
            instruction=INSTRUCTION,
            toml={"metadata": {"id": task_id, "category": category, "source": "clawgym scan family"},
                  "agent": {"timeout_sec": 120}, "verifier": {"timeout_sec": 20}},
            workspace_text={f: "\n".join(lines) + "\n" for f, lines in files.items()},
            tests_text={"check.py": CHECK_PY, "expected.json": json.dumps({"answer": holder}) + "\n"},
        )
        return Drawn(draft, json.dumps([category, files], sort_keys=True))

    def teach(self, instruction: str, tool_results: list[str]) -> Reply:
        """Read a.txt, then b.txt, until one shows the error; name it (c.txt when neither did); then finish."""
        if INSTRUCTION not in instruction:
            raise ValueError(f"not a scan instruction: {instruction[:80]!r}")
        action, i = "cat", 0  # the plan so far: each tool result answers the action before it
        for result in tool_results:
            if action == "write":
                return Reply(text="done")
            if re.search(rf"^{MARK}$", result, re.M):
                action = "write"
            elif i + 1 < len(FILES) - 1:
                i += 1
            else:
                action, i = "write", len(FILES) - 1
        if action == "cat":
            return tool_call("bash", {"command": f"cat {FILES[i]}"})
        return tool_call("write", {"path": ANSWER, "content": FILES[i]})
