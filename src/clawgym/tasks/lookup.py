"""The `lookup` task family: find a key among a few files with a tool, then write what was found.

Every task's workspace holds three small files, `a.txt`, `b.txt` and `c.txt`, each with two
`key=digit` lines. The instruction names one key (one of four, `ASKED`; the files' other keys are
drawn from sixteen) and asks for one of three things (the categories
of the per-category Pass@1 table):

| category | instruction | answer in answer.txt |
|---|---|---|
| `value` | Write the value of key K to answer.txt. | the digit after `K=` |
| `file`  | Write the name of the file that holds key K to answer.txt. | `a.txt`, `b.txt` or `c.txt` |
| `count` | Write how many files hold key K to answer.txt. | 1, 2 or 3 |

The agent cannot know the answer without looking (each is drawn at random), so a solution takes at
least two tool calls, and what it writes depends on what the first call showed: a search
(`grep -h K= *`, `grep -l K= *`, `grep -l K= * | wc -l`), then a write of the result. The check
gives partial credit: `answered` (answer.txt exists and is not empty) and `correct` (its stripped
text is the answer), each worth half.

Names are short on purpose: keys are words that the init-model tokenizer keeps as one token, the
values are digits, so a small model can learn the family's form with SFT in minutes.
"""

from __future__ import annotations

import json
import random
import re

from clawgym.tasks.generated import Drawn, Reply, tool_call
from clawgym.tasks.writer import TaskDraft

# One token each in the init-model tokenizer, with and without a leading space; none is a substring
# of another, so `grep K=` finds exactly key K.
KEYS = ("app", "csv", "data", "date", "item", "json", "line", "log", "note", "path", "row", "sum", "text",
        "time", "user", "week")
ASKED = KEYS[:4]
"""the keys an instruction asks for; the other twelve fill the files around them. With four to choose
from, a policy that has not learned to copy the key from the instruction guesses it right one time in
four (docs/tasks.md, `lookup`)."""
FILES = ("a.txt", "b.txt", "c.txt")
LINES_PER_FILE = 2
ANSWER = "answer.txt"

INSTRUCTIONS = {
    "value": "Write the value of key {key} to answer.txt.",
    "file": "Write the name of the file that holds key {key} to answer.txt.",
    "count": "Write how many files hold key {key} to answer.txt.",
}
COMMANDS = {"value": "grep -h {key}= *", "file": "grep -l {key}= *", "count": "grep -l {key}= * | wc -l"}

CHECK_PY = '''"""lookup family check: answer.txt against the expected answer (tests/expected.json)."""
import json
import os
import pathlib

tests = pathlib.Path(os.environ.get("CLAWGYM_TESTS") or pathlib.Path(__file__).parent)
expected = json.loads((tests / "expected.json").read_text())["answer"]
path = pathlib.Path("answer.txt")
text = path.read_text(errors="replace").strip() if path.is_file() else ""
print(json.dumps({"answered": bool(text), "correct": text == expected}))
'''


class LookupFamily:
    name = "lookup"
    categories = tuple(INSTRUCTIONS)

    def draw(self, rng: random.Random, category: str, task_id: str) -> Drawn:
        key = rng.choice(ASKED)
        others = [k for k in KEYS if k != key]
        rng.shuffle(others)
        # Which files hold the key: one for value/file, one to three for count.
        holders = rng.sample(FILES, rng.randint(1, len(FILES)) if category == "count" else 1)
        files: dict[str, list[str]] = {}
        for f in FILES:
            keys = [others.pop() for _ in range(LINES_PER_FILE)]
            if f in holders:
                keys[rng.randrange(LINES_PER_FILE)] = key
            files[f] = [f"{k}={rng.randint(1, 9)}" for k in keys]
        holder_line = next(line for line in files[holders[0]] if line.startswith(f"{key}="))
        answer = {"value": holder_line.split("=")[1], "file": holders[0], "count": str(len(holders))}[category]
        draft = TaskDraft(
            id=task_id,
            instruction=INSTRUCTIONS[category].format(key=key),
            toml={"metadata": {"id": task_id, "category": category, "source": "clawgym lookup family"},
                  "agent": {"timeout_sec": 120}, "verifier": {"timeout_sec": 20}},
            workspace_text={f: "\n".join(lines) + "\n" for f, lines in files.items()},
            tests_text={"check.py": CHECK_PY, "expected.json": json.dumps({"answer": answer}) + "\n"},
        )
        signature = json.dumps([category, key, files], sort_keys=True)
        return Drawn(draft, signature)

    def teach(self, instruction: str, tool_results: list[str]) -> Reply:
        """Search for the key, write what the search printed, then finish."""
        category, key = parse_instruction(instruction)
        if not tool_results:
            return tool_call("bash", {"command": COMMANDS[category].format(key=key)})
        if len(tool_results) == 1:
            found = _first_output_line(tool_results[0])
            if category == "value":
                found = found.split("=", 1)[-1]
            return tool_call("write", {"path": ANSWER, "content": found})
        return Reply(text="done")


def parse_instruction(instruction: str) -> tuple[str, str]:
    """(category, key) of a lookup instruction; ValueError for any other text."""
    for category, template in INSTRUCTIONS.items():
        m = re.search(re.escape(template).replace(re.escape("{key}"), r"(\w+)"), instruction)
        if m:
            return category, m.group(1)
    raise ValueError(f"not a lookup instruction: {instruction[:80]!r}")


def _first_output_line(result: str) -> str:
    """The first line a command printed (agentloop's bash results start with `exit code N`)."""
    lines = [l.strip() for l in result.splitlines() if l.strip()]
    if lines and lines[0].startswith("exit code"):
        lines = lines[1:]
    return lines[0] if lines else ""
