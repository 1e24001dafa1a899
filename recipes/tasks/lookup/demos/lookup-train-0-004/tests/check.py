"""lookup family check: answer.txt against the expected answer (tests/expected.json)."""
import json
import os
import pathlib

tests = pathlib.Path(os.environ.get("CLAWGYM_TESTS") or pathlib.Path(__file__).parent)
expected = json.loads((tests / "expected.json").read_text())["answer"]
path = pathlib.Path("answer.txt")
text = path.read_text(errors="replace").strip() if path.is_file() else ""
print(json.dumps({"answered": bool(text), "correct": text == expected}))
