"""Task flags read from text: the network heuristic and the tools a grader runs (issue 15 item 8).

Small synthetic prompts with the phrases that fooled the old heuristic; the figures over the real
task sets are in docs/tasks.md ("Flags from text") and come from `clawgym tasks import`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clawgym.tasks.flags import needs_from_text, network_clauses, tools_from_code
from clawgym.tasks.importers import import_tasks


@pytest.mark.parametrize(
    "prompt",
    [
        "Summarize the notes in input/research/ into output/summary.md.",
        "Read every file.\n\n## Research\n\nThe files under notes/ hold the interviews. Write report.md.",
        'Write sources.json: a list of {"title": str, "url": str}, e.g. {"url": "https://www.nasa.gov/uap"}.',
        "Each entry records its homepage (like https://docs.python.org/3/) as a plain string.",
        "Do not fetch external resources. Build the table from input/prices.csv.",
        "Fix the bug in api.py so the tests pass.",
        "The config points at https://api.example.com/v1; change its timeout to 30 in config.yaml.",
        "Tie research-related tasks to topics from input/research_index.csv; add phases: Research, Draft, Review.",
        "I need help with my document layout analysis research and want a plan in plan.md.",
        "Please research the company using only the files under input/ and name a decision-maker.",
        "Use only the provided inputs; no Internet access is required.",
        'Add a third section titled "Research and draft counterpoints" to outline.md.',
        "Write a table with the previous day's price, current price and change for each row of prices.csv.",
        "Use a local web server on http://localhost:8080 to serve the page and test it.",
    ],
)
def test_offline_prompts_are_not_flagged(prompt: str) -> None:
    assert network_clauses(prompt) == [] and "network" not in needs_from_text(prompt)


@pytest.mark.parametrize(
    "prompt",
    [
        "Build the panel.\n\n1) Internet data source (essential)\n- the World Bank indicator page.",
        "1) Download the official IANA registry in CSV form and save it to downloads/iana.csv.",
        "Merge the records. Internet retrieval is mandatory: the rates must be today's.",
        "The Internet step is essential: use a search engine to locate official pages; do not rely on blogs.",
        "Add requirements.txt (use Internet to install) with Pillow and numpy.",
        "Research the current stock price of Apple and save it to stock.txt.",
        "Get the JSON from https://data.gov.example-free.org/api/items and count the items.",
        "Download and use an offline translation model from its official project page.",
        "Create weather.py that fetches weather data for San Francisco using the wttr.in API.",
        "For each product, research and document its pricing.",
    ],
)
def test_network_prompts_are_flagged(prompt: str) -> None:
    assert network_clauses(prompt) and "network" in needs_from_text(prompt)


def test_negation_is_read_per_clause() -> None:
    # An offline remark in one clause does not cancel a required download in another.
    text = "Do not use a mirror or a third-party site. Download the registry from iana.org."
    assert network_clauses(text) == ["Download the registry from iana.org"]


@pytest.mark.parametrize(
    "code, tools",
    [
        ('subprocess.run(["git", "log", "--oneline"], cwd=ws)', ["git"]),
        ('subprocess.run("git log --oneline", shell=True)', ["git"]),
        ('os.system(f"git -C {ws} status")', ["git"]),
        ("if shutil.which('git') is None: sys.exit(1)", ["git"]),
        ('cmd = "/usr/bin/git rev-list --count HEAD"', ["git"]),
        ('subprocess.run([sys.executable, "-m", "pytest", "-q"])', ["pytest"]),
        ('row = {"node": 1, "digit": 2}; keys = ["python ", "bash "]', []),
        ('ok = item["node"] == "git" or cmd.startswith("bash ")', []),
    ],
)
def test_tools_from_code(code: str, tools: list[str]) -> None:
    assert tools_from_code(code) == tools


def test_clawgym_grader_running_git_in_a_helper_lists_it(tmp_path: Path) -> None:
    d = tmp_path / "cg" / "task_0001"
    (d / "reward").mkdir(parents=True)
    (d / "data_entry.json").write_text(json.dumps({"task_id": "task_0001", "user_query": "Commit the fix in repo/."}))
    (d / "reward" / "check.py").write_text("import json, sys\nfrom gitcheck import count\nprint(json.dumps({'commits': count(sys.argv[1])}))\n")
    (d / "reward" / "gitcheck.py").write_text("import subprocess\n\ndef count(ws):\n"
                                             "    out = subprocess.run(['git', '-C', ws, 'rev-list', '--count', 'HEAD'], capture_output=True, text=True)\n"
                                             "    return float(out.stdout.strip() == '2')\n")
    (t,) = import_tasks("clawgym", tmp_path / "cg", tmp_path / "out").imported
    assert t.tools == ("git",) and "network" not in t.flags()
