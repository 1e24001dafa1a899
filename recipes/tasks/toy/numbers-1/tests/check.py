"""Toy check: how purely the agent's final answer is digits (whitespace ignored).

score = max(0, 2 * share_of_digits - 1): digits only scores 1, half digits or fewer scores 0. A
random tiny policy scores a little above 0 (number tokens are common in its vocabulary), so the
task is learnable from scratch; the final message reaches the check as $CLAWGYM_FINAL_MESSAGE.
"""
import json
import os
import pathlib

path = os.environ.get("CLAWGYM_FINAL_MESSAGE")
answer = pathlib.Path(path).read_text(errors="replace") if path else ""
chars = [c for c in answer if not c.isspace()]
digits = sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0
print(json.dumps({"digits_only": round(max(0.0, 2 * digits - 1), 6)}))
