"""The code base's shape: no import cycles among clawgym modules, no import of another module's
private names, stage configs that load without torch, and config fields documented once."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
DOCS = Path(__file__).resolve().parents[1] / "docs"

# Cycles allowed, each with its reason. None today: keep it that way.
ALLOWED_CYCLES: dict[frozenset[str], str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted((SRC / "clawgym").rglob("*.py")):
        name = ".".join(p.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """module -> the clawgym modules it imports (also inside functions); and every `from x import _name` across modules."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                graph[mod] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                target = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    target = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                if not target.startswith("clawgym"):
                    continue
                for a in node.names:
                    graph[mod].add(f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target)
                    if a.name.startswith("_") and not a.name.startswith("__") and target != mod:
                        private.append(f"{mod}:{node.lineno} imports {a.name} from {target}")
    return {m: {t for t in ts if t in mods and t != m} for m, ts in graph.items()}, private


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [frozenset("abc")]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_among_clawgym_modules():
    graph, _ = _imports(_modules())
    assert len(graph) > 50  # the walk found the package
    cycles = [sorted(c) for c in _cycles(graph) if c not in ALLOWED_CYCLES]
    assert cycles == []


def test_no_module_imports_another_modules_private_names():
    _, private = _imports(_modules())
    assert private == []


def test_loading_a_recipe_imports_neither_torch_nor_the_harness_adapters_nor_the_train_loop():
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.toml"
    code = ("import sys; from clawgym.config import load_recipe; load_recipe(sys.argv[1]); "
            "import clawgym.train.config, clawgym.rollout.config; "
            "print(sorted(m for m in ('torch', 'transformers', 'clawgym.rollout.harnesses', 'clawgym.train.loop') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(recipe)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_harness_names_match_the_registry():
    from clawgym.rollout.config import HARNESS_NAMES
    from clawgym.rollout.harnesses import HARNESSES

    assert tuple(HARNESSES) == HARNESS_NAMES


def test_every_config_field_has_help_and_docs_config_md_is_generated_from_them():
    from clawgym import config
    from clawgym.rollout.config import RolloutConfig
    from clawgym.train.config import TrainConfig

    for cls in [*config._SECTIONS.values(), TrainConfig, RolloutConfig]:
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
    text = (DOCS / "config.md").read_text(encoding="utf-8")
    generated = config.reference_markdown()
    assert text.split("<!-- generated below: clawgym.config.reference_markdown() -->\n\n", 1)[1] == generated
    for cls in [*config._SECTIONS.values(), TrainConfig, RolloutConfig]:
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in text


def test_clawgym_train_has_one_option_per_train_config_field():
    from typer.main import get_command

    from clawgym.cli import app
    from clawgym.train.config import TrainConfig

    train = get_command(app).commands["train"]
    options = {p.name for p in train.params}
    assert {f.name for f in dataclasses.fields(TrainConfig)} <= options
    by_name = {p.name: p for p in train.params}
    for f in dataclasses.fields(TrainConfig):
        assert by_name[f.name].help == f.metadata["help"] or f.name in ("trees", "rollouts")
        if f.default is not dataclasses.MISSING:
            assert by_name[f.name].default == f.default


@pytest.mark.parametrize("key", ["timeout", "timeout_s"])
def test_the_recipe_reads_the_renamed_rollout_key(tmp_path, key):
    from clawgym.config import load_recipe

    (tmp_path / "tasks").mkdir()
    (tmp_path / "r.toml").write_text(f'[model]\ninit = "tiny"\n[rollout]\ntasks = "tasks"\n{key} = 7\n')
    assert load_recipe(tmp_path / "r.toml").rollout.timeout_s == 7.0


def test_the_old_and_new_name_of_a_rollout_key_together_are_one_clear_error(tmp_path):
    from clawgym.config import load_recipe
    from clawgym.errors import UserError

    (tmp_path / "tasks").mkdir()
    (tmp_path / "r.toml").write_text('[model]\ninit = "tiny"\n[rollout]\ntasks = "tasks"\ntimeout = 7\ntimeout_s = 8\n')
    with pytest.raises(UserError, match="give 'timeout_s' only"):
        load_recipe(tmp_path / "r.toml")

