"""Task flags read from a foreign task's text: does it need the network, a browser, the transcript,
which executables does its grader run (docs/tasks.md, "Flags from text").

Importers call `needs_from_text` on the prompt and `tools_from_code` on the grader's code; the
result goes into `[claw] needs` / `tools`, which a user can edit where the heuristic is wrong.
"""

from __future__ import annotations

import re

# The network flag reads the prompt clause by clause (docs/tasks.md, "Flags from text"). First
# what is not prose is set aside: headings ("## Research"), paths and file names
# (`input/research/`, `api.py`, `needs_research`), quoted text (an output template such as
# "Research and draft ..." is not an instruction) and URLs, which count only where a clause says
# to get something from them (a URL inside an output spec is not an instruction to fetch it).
_URL = re.compile(r"https?://[^\s)\]>'\"`]+", re.I)
_LOCAL_URL = re.compile(r"https?://(localhost|127\.|0\.0\.0\.0|\[::1\]|([\w-]+\.)*(example|test|invalid|local)([/:]|$|\.(com|org|net)\b))", re.I)
_TOKEN = re.compile(r"[^\s`'\"()\[\],;]+")
_PATHLIKE = re.compile(r"[/\\_]|^[\w-]+\.(py|md|csv|jsonl?|txt|ya?ml|html?|xml|js|ts|sh|toml|ini|cfg|log|pdf|xlsx?|db|sqlite)\W*$", re.I)
_QUOTED = re.compile(r'"[^"\n]{0,300}"|“[^”\n]{0,300}”')
_CLAUSE = re.compile(r"[.!?;:]+(?=\s|$)|\n|—")
# A trigger is negated by one of these before it in its clause, or just after it ("Internet
# access is not required"); "offline" only where something is to be or stay offline, since
# "download an offline translation model" needs the network.
_NEGATION = re.compile(r"\b(no|not|never|without|avoid|nor|cannot|unavailable|forbidden|prohibited|disallowed|use only|using only)\b"
                       r"|n't\b|\bonly (the )?(local|provided|given|supplied|included)\b"
                       r"|\b(work|works|run|runs|be|stay|stays|is|are|remain|operate|entirely|fully|completely) offline\b", re.I)
_ACCESS = r"(use|using|uses|from|via|over|on|access|accessing|search|searching|browse|browsing|requires?|needs?|needed)"
_NETWORK_TRIGGERS = [
    rf"\b{_ACCESS} (the )?(internet|web)\b",
    r"\b(internet|online|web)\b[^,]{0,40}\b(essential|required|mandatory|necessary|needed)\b",
    r"\binternet (access|sources?|data|retrieval|search|download|step|use|lookup|connection|research)\b",
    r"\b(search|look up|look it up|find|check|verify|research) online\b|\bonline (search|sources?|lookup|research|resources?)\b",
    r"\bweb[ -]?(search|research|fetch|browsing|scrap\w*|sources?|lookup)\b|\bsearch engine\b|\bsearch the (web|internet)\b",
    r"\b(do|perform|conduct|some|web|online|internet) research\b",
    r"(^\W*(\d+[.)]\s*)?|,\s*|\b(please|to|and|then|help \w+|must|should|will|you|also)\s+)"
    r"research (the|and|at least|online|current|latest|which|what|how|whether|who|options|\d)\b",
    r"\bdownload(s|ing)? (the|a|an|and|from|two|three|each|all|\d)\b|^\W*(\d+[.)]\s*)?download\b|\bto download\b",
    r"\bfetch(es|ing)?\b",
    r"\bLIVEURL\b.*\b(fetch|download|get|retriev|visit|open|brows|query|call|scrap|pull|access|navigate)|"
    r"\b(fetch|download|get|retriev|visit|open|brows|query|call|scrap|pull|access|navigate|from|via|at|curl|wget)\w*\s+(\S+\s+){0,3}LIVEURL\b",
    r"\b(find|list) \d+ upcoming\b|\bcurrent stock price|\bcurrent price of\b|\bas of [A-Z][a-z]+ \d|\byoutube\b|\bgenerate an image\b|\bon github\b",
    r"\b(compare|current|latest) pricing\b|\bpricing (across|of|from) (these |the )?(providers|vendors|services)\b",
]
NETWORK_RE = re.compile("|".join(f"(?:{t})" for t in _NETWORK_TRIGGERS), re.I)
BROWSER_RE = re.compile(r"\b(playwright|chromium|selenium|headless browser|puppeteer)\b", re.I)
TRANSCRIPT_RE = re.compile(r"for\s+\w+\s+in\s+transcript|transcript\s*\[|len\(\s*transcript\s*\)|in\s+transcript\b")
# A string literal that opens a command: the first item of a (non-subscript) list, the first
# argument of a call that runs or finds a program, or an assigned command line, being or starting
# with a tool's name (or /usr/bin path): ["git", "log"], run("git log", shell=True),
# system(f"git -C {ws} log"), which('git'), cmd = "git status". A tool's name as a key, a later
# list item or a compared string (item["node"], [.., "bash "], s.startswith("bash ")) is no command.
_COMMAND_OPENER = (r"(?:(?<![\w\])])\[|\b(?:run|call|check_call|check_output|Popen|system|popen|which|spawn\w*|exec\w*"
                   r"|getoutput|getstatusoutput)\(|(?<![=!<>])=(?!=))")
TOOL_RE = re.compile(_COMMAND_OPENER + r"""\s*[fr]?["'](?:/usr/(?:local/)?bin/)?(git|pytest|bash|node|npm|npx|gh|gws)(?=["']|\s)"""
                     r"""|-m["',\s]+pytest""")


def network_clauses(prompt: str) -> list[str]:
    """The prose clauses of `prompt` that ask for live network access (empty: none do)."""
    text = "\n".join(line for line in prompt.splitlines() if not line.lstrip().startswith("#"))
    text = _URL.sub(lambda m: " LOCALURL " if _LOCAL_URL.match(m.group(0)) else " LIVEURL ", text)
    text = _TOKEN.sub(lambda m: " PATH " if _PATHLIKE.search(m.group(0)) else m.group(0), text)
    text = _QUOTED.sub(" QUOTED ", text)
    found = []
    for clause in _CLAUSE.split(text):
        for m in NETWORK_RE.finditer(clause):
            if not (_NEGATION.search(clause, 0, m.start()) or _NEGATION.search(clause[m.end():m.end() + 30])):
                found.append(clause.strip())
                break
    return found


def needs_from_text(prompt: str) -> set[str]:
    """`network` and `browser` as the prompt's words suggest."""
    needs = set()
    if network_clauses(prompt):
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
