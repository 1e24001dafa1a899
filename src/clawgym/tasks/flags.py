"""Task flags read from a foreign task's text: does it need the network, a browser, the transcript,
which executables does its grader run (docs/tasks.md, "Flags from text").

Importers call `needs_from_text` on the prompt and `tools_from_code` on the grader's code; the
result goes into `[claw] needs` / `tools`, which a user can edit where the heuristic is wrong.
"""

from __future__ import annotations

import re

# Prompt words that mean live web access (checked against the research report's hand
# classification of PinchBench v2.0.0; see docs/tasks.md for the agreement figure).
NETWORK_RE = re.compile(
    r"https?://(?!localhost|127\.0\.0\.1|example\.)|\bresearch\b|\bfetch(es)?\b|\b(find|list) \d+ upcoming\b"
    r"|\bcurrent stock price|\bcurrent price of|\bas of [A-Z][a-z]+ \d|\byoutube\b|\bweb[ _-]?search|\bweb[ _-]fetch"
    r"|\bsearch the (web|internet)|\bgenerate an image\b|\bon github\b|\bapi\.\w|\bpricing\b.*\bproviders?\b",
    re.I | re.S,
)
# Phrases that say the opposite; they win over NETWORK_RE.
OFFLINE_RE = re.compile(
    r"\b(no|without) (internet|network)( access)?\b|\boffline\b|\bdo not fetch\b|\bnot\b[^.]{0,60}\bfrom the internet"
    r"|\b(do not|don't|never) (browse|access|use) (the )?(internet|web|network)|\buse only the provided\b"
    r"|\bbased on your (own )?knowledge\b",
    re.I,
)
BROWSER_RE = re.compile(r"\b(playwright|chromium|selenium|headless browser|puppeteer)\b", re.I)
TRANSCRIPT_RE = re.compile(r"for\s+\w+\s+in\s+transcript|transcript\s*\[|len\(\s*transcript\s*\)|in\s+transcript\b")
TOOL_RE = re.compile(r"""["'](git|pytest|bash|node|npm|npx|gh|gws)["']|-m["',\s]+pytest""")


def needs_from_text(prompt: str) -> set[str]:
    """`network` and `browser` as the prompt's words suggest."""
    needs = set()
    if NETWORK_RE.search(prompt) and not OFFLINE_RE.search(prompt):
        needs.add("network")
    if BROWSER_RE.search(prompt):
        needs.add("browser")
    return needs


def tools_from_code(code: str) -> list[str]:
    """The executables a grader's code runs, sorted."""
    found = {m.group(1) or "pytest" for m in TOOL_RE.finditer(code)}
    return sorted(found)


def reads_transcript(code: str) -> bool:
    """Whether a grader's code looks at the agent's transcript."""
    return bool(TRANSCRIPT_RE.search(code))
