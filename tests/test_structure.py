"""The code base's shape: no import cycles among clawgym modules, no import of another module's
private names, stage configs that load without torch, and config fields documented once."""

from __future__ import annotations

import ast
import dataclasses
import re
import shlex
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


# The pipeline's layers, bottom to top: a module imports only from its own layer or those below
# (docs/architecture.md, "The source tree"). Top-level modules and `artifacts`/`models` are the
# shared ground; each stage package is a layer of its own; `run` orchestrates the stages; `cli` is
# the table of contents over all of it.
LAYERS: dict[str, int] = {"tasks": 1, "engines": 2, "proxy": 3, "rollout": 4, "trees": 4, "train": 5, "run": 6, "cli": 7}
MAX_TOP_LEVEL_MODULES, MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_INNER_IMPORTS = 12, 450, 80, 20


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], 0) if len(parts) > 1 else 0


def test_the_layer_check_finds_an_import_up_a_layer():
    graph = {"clawgym.tasks.spec": {"clawgym.engines.base"}, "clawgym.engines.base": {"clawgym.errors"}}
    assert [(m, t) for m, ts in graph.items() for t in ts if _layer(t) > _layer(m)] == [("clawgym.tasks.spec", "clawgym.engines.base")]


def test_no_import_runs_up_a_layer():
    graph, _ = _imports(_modules())
    up = sorted(f"{m} imports {t}" for m, ts in graph.items() for t in ts if _layer(t) > _layer(m))
    assert up == []


def test_at_most_twelve_modules_sit_directly_in_the_package_and_none_is_named_after_a_standard_one():
    top = sorted(p.stem for p in (SRC / "clawgym").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    packages = {p.name for p in (SRC / "clawgym").iterdir() if (p / "__init__.py").is_file()}
    assert sorted((set(top) | packages) & sys.stdlib_module_names) == []


def test_no_module_is_longer_than_450_lines():
    long = {str(p.relative_to(SRC)): n for p in (SRC / "clawgym").rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def _functions(tree: ast.AST):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_function_is_longer_than_80_lines():
    long = [f"{p.relative_to(SRC)}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1} lines)"
            for p in sorted((SRC / "clawgym").rglob("*.py")) for f in _functions(ast.parse(p.read_text(encoding="utf-8")))
            if f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_imports_inside_functions_are_few_outside_the_cli_and_each_says_why():
    """A clawgym import inside a function breaks a real cycle or keeps a command's start fast; the
    comment on its line or the line above says which."""
    inner, silent = [], []
    for p in sorted((SRC / "clawgym").rglob("*.py")):
        if p.relative_to(SRC / "clawgym").parts[0] == "cli":
            continue
        lines = p.read_text(encoding="utf-8").splitlines()
        for f in _functions(ast.parse("\n".join(lines))):
            for node in ast.walk(f):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("clawgym") or \
                        isinstance(node, ast.Import) and any(a.name.startswith("clawgym") for a in node.names):
                    where = f"{p.relative_to(SRC)}:{node.lineno}"
                    if where not in inner:
                        inner.append(where)
                        said = lines[node.lineno - 1] + lines[node.lineno - 2]
                        if "#" not in said:
                            silent.append(where)
    assert len(inner) <= MAX_INNER_IMPORTS, inner
    assert silent == []


def test_docs_architecture_draws_every_module_in_its_package():
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    tree = text[text.index("## The source tree"):].split("\n## ", 1)[0]
    missing = []
    for p in sorted((SRC / "clawgym").rglob("*.py")):
        if p.stem in ("__init__", "__main__"):
            continue
        # the package's own block: from its line to the next package's
        package = p.parent.relative_to(SRC / "clawgym").parts[:1]
        start = tree.index(f" {package[0]}/") if package else 0
        block = tree[start:]
        if package:
            nxt = [block.index(f" {q}/", 1) for q in LAYERS | {"artifacts": 0, "models": 0}
                   if q != package[0] and f" {q}/" in block[1:]]
            block = block[:min(nxt)] if nxt else block
        if p.name not in block:
            missing.append(str(p.relative_to(SRC)))
    assert missing == []


def test_loading_a_recipe_imports_neither_torch_nor_the_harness_adapters_nor_the_train_loop():
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.toml"
    code = ("import sys; from clawgym.run.recipe import load_recipe; load_recipe(sys.argv[1]); "
            "import clawgym.train.config, clawgym.rollout.config; "
            "print(sorted(m for m in ('torch', 'transformers', 'clawgym.rollout.harnesses', 'clawgym.train.loop') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(recipe)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# What a comment may not cite: documents that live outside the repository (the design brief, the
# research notes, the shared folder). What the code relies on is written into docs/ and cited there.
OUTSIDE_DOCS = re.compile(r"DESIGN(\.md| §)|shared/research|\bresearch/[\w-]+\.md|\.\./shared/(?!tasks/)")


def test_no_comment_cites_a_document_outside_the_repository():
    root = SRC.parent
    hits = [f"{p.relative_to(root)}:{i}: {line.strip()}"
            for folder in ("src", "tests", "bench", "recipes", "docs")
            for p in sorted((root / folder).rglob("*")) if p.suffix in (".py", ".toml", ".sh", ".md") and p != Path(__file__)
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE_DOCS.search(line)]
    assert not hits, "\n".join(hits)


def test_harness_names_match_the_registry():
    from clawgym.rollout.config import HARNESS_NAMES
    from clawgym.rollout.harnesses import HARNESSES

    assert tuple(HARNESSES) == HARNESS_NAMES


def test_every_config_field_has_help_and_docs_config_md_is_generated_from_them():
    from clawgym.run import recipe as config
    from clawgym.proxy.config import ProxyConfig
    from clawgym.rollout.config import RolloutConfig
    from clawgym.train.config import TrainConfig

    for cls in [*config._SECTIONS.values(), TrainConfig, RolloutConfig, ProxyConfig]:
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
    text = (DOCS / "config.md").read_text(encoding="utf-8")
    generated = config.reference_markdown()
    assert text.split(config.GENERATED_MARK, 1)[1] == generated, "regenerate it: python -m clawgym.run.recipe docs/config.md"
    for cls in [*config._SECTIONS.values(), TrainConfig, RolloutConfig, ProxyConfig]:
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in text


def _options_match_fields(command: str, configs: dict[str, list[type]], given: list[str], skipped: set[str] = frozenset(),
                          own_defaults: dict[str, type | tuple[type, str]] | None = None, own_help: set[str] = frozenset()) -> None:
    """Every field of `configs` (but `skipped`) is an option of `command` with the field's help (but
    `own_help`), and the value the command gets for an option not given is the field's default (or
    that of the same field of `own_defaults`' config)."""
    from typer.main import get_command

    from clawgym.cli import app
    from clawgym.fields import cli_help, default_of, field_of, help_of, parse_cli

    cmd = get_command(app).commands[command]
    by_name = {p.name: p for p in cmd.params}
    parsed = parse_cli(configs[0], cmd.make_context(command, list(given)).params)
    required = {}
    for i in range(0, len(given), 2):
        required[next(p.name for p in cmd.params if given[i] in p.opts)] = given[i + 1]
    for cls in configs:
        for f in dataclasses.fields(cls):
            if f.name in skipped:
                assert f.name not in by_name, f"{cls.__name__}.{f.name} is skipped yet has an option"
                continue
            assert f.name in by_name, f"{cls.__name__}.{f.name} has no option in `clawgym {command}`"
            origin = (own_defaults or {}).get(f.name)
            source = f if origin is None else field_of(*origin) if isinstance(origin, tuple) else field_of(origin, f.name)
            old = f.metadata.get("aliases", ())
            if f.name not in own_help:
                expected = cli_help(source) + (f" (old name: {', '.join(old)})" if old else "")
                assert help_of(source) and by_name[f.name].help == expected, f"{command} --{f.name}: help is not the field's"
            if f.name in required:
                continue
            assert default_of(source) is not dataclasses.MISSING, f"{cls.__name__}.{f.name} is required but not given"
            assert parsed[f.name] == default_of(source), f"{command} --{f.name}: default is not the field's"


def test_clawgym_train_has_one_option_per_train_config_field():
    from clawgym.train.config import TrainConfig

    # trees and rollouts are optional on the command line (STEP's by default), with their own help
    _options_match_fields("train", [TrainConfig], ["--trees", "t", "--rollouts", "r", "--model", "m", "--out", "o"],
                          own_help={"trees", "rollouts"})


ROLLOUT_REQUIRED = ["--tasks", "t", "--out", "o"]


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_clawgym_rollout_and_eval_have_one_option_per_rollout_config_field(command):
    from clawgym.cli.stages import ROLLOUT_SKIP, EngineShorthands
    from clawgym.run.recipe import EvalSection
    from clawgym.rollout.config import JudgeChoice, RolloutConfig

    assert ROLLOUT_SKIP == {"verifier"}  # its options are JudgeChoice's
    _options_match_fields(command, [RolloutConfig, JudgeChoice, EngineShorthands], ROLLOUT_REQUIRED, ROLLOUT_SKIP,
                          own_defaults={"group_size": (EvalSection, "samples_per_task")} if command == "eval" else None)


def test_clawgym_serve_proxy_has_one_option_per_proxy_config_field_and_build_trees_the_trees_section():
    from clawgym.run.recipe import TreesSection
    from clawgym.proxy.config import SERVE_SKIP, ProxyConfig

    _options_match_fields("serve-proxy", [ProxyConfig], ["--model", "m"], SERVE_SKIP)
    _options_match_fields("build-trees", [TreesSection], [])
    from clawgym.fields import default_of, field_of
    from clawgym.trees import DEFAULT_MAX_LEAVES

    assert default_of(field_of(TreesSection, "max_leaves")) == DEFAULT_MAX_LEAVES  # the library's default for its callers


def test_a_recipe_section_key_has_its_stage_configs_type_help_and_default_but_where_it_says():
    import typing

    from clawgym.run import recipe as config
    from clawgym.fields import default_of, field_of, help_of
    from clawgym.rollout.config import JudgeChoice, RolloutConfig

    owners = {**{f.name: RolloutConfig for f in dataclasses.fields(RolloutConfig)}, "judge_url": JudgeChoice, "judge_model": JudgeChoice}
    own_default = {"tasks": None, "group_size": 8, "concurrency": 8}  # an [offline] recipe has no tasks; a run's group is 8
    hints = typing.get_type_hints(config.RolloutSection)
    for f in dataclasses.fields(config.RolloutSection):
        owner = field_of(owners[f.name], f.name)
        assert help_of(f) == help_of(owner), f.name
        assert default_of(f) == own_default.get(f.name, default_of(owner)), f.name
        if f.name != "tasks":
            assert hints[f.name] == typing.get_type_hints(owners[f.name])[f.name], f.name


def test_the_old_rollout_flags_still_give_the_fields_their_values(tmp_path):
    from typer.main import get_command

    from clawgym.cli import app
    from clawgym.fields import parse_cli
    from clawgym.rollout.config import RolloutConfig

    line = [*ROLLOUT_REQUIRED, "--harness", "agentloop, codex", "--timeout", "7", "--proxy", "http://h:1", "--ray", "auto",
            "--harness-option", "agentloop.max_tokens=8", "--harness-option", 'codex.model="x"', "--chat-template", "chatml-tools"]
    cmd = get_command(app).commands["rollout"]
    values = parse_cli(RolloutConfig, cmd.make_context("rollout", line).params)
    assert values["harnesses"] == ["agentloop", "codex"] and values["timeout_s"] == 7.0 and values["proxy_url"] == "http://h:1"
    assert values["ray"] == "auto" and values["chat_template"] == "chatml-tools"
    assert values["harness_options"] == {"agentloop": {"max_tokens": 8}, "codex": {"model": "x"}}


def test_each_command_reads_its_new_flags_and_for_one_release_the_old_ones():
    from typer.main import get_command

    from clawgym.cli import app

    commands = get_command(app).commands

    def params(command, *line):
        cmd = commands[command[0]] if len(command) == 1 else commands[command[0]].commands[command[1]]
        return cmd.make_context(command[-1], list(line)).params

    for flag in ("--group-size", "--n"):
        assert params(["rollout"], *ROLLOUT_REQUIRED, flag, "3")["group_size"] == 3
    for flag in ("--samples-per-task", "--n"):
        assert params(["eval"], *ROLLOUT_REQUIRED, flag, "2")["group_size"] == 2
    assert params(["eval"], *ROLLOUT_REQUIRED)["group_size"] == 4  # [eval] samples_per_task's default, not rollout's 1
    for flag in ("--rollout-timeout", "--timeout"):
        assert params(["rollout"], *ROLLOUT_REQUIRED, flag, "7")["timeout_s"] == 7.0
    for flag in ("--wait-timeout", "--timeout"):
        assert params(["sync"], "--proxy", "http://h:1", "--checkpoint", ".", flag, "9")["timeout"] == 9.0
    for flag in ("--count", "--n"):
        assert params(["tasks", "make"], "lookup", "out", flag, "5", "--split", "train")["n"] == 5
    for flag, key in (("--sample-calls", "max_calls"), ("--max-calls", "max_calls"), ("--only-version", "policy_version"),
                      ("--policy-version", "policy_version")):
        assert params(["mismatch"], "--calls", "c.parquet", "--model", "m", flag, "3")[key] == 3


@pytest.mark.parametrize("section,old,new,value", [("rollout", "n", "group_size", 3), ("eval", "n", "samples_per_task", 2),
                                                   ("sft", "n", "demonstrations", 0), ("rollout", "timeout", "timeout_s", 7.0)])
def test_a_recipe_key_under_its_old_name_loads_with_one_notice(tmp_path, capsys, section, old, new, value):
    from clawgym.run import recipe as config

    (tmp_path / "tasks").mkdir()
    (tmp_path / "r.toml").write_text('[model]\ninit = "tiny"\n[rollout]\ntasks = "tasks"\n'
                                     + (f"{old} = {value}\n" if section == "rollout" else f"[{section}]\n{old} = {value}\n"))
    for _ in range(2):
        r = config.load_recipe(tmp_path / "r.toml")
    assert getattr(getattr(r, section), new) == value
    notices = [line for line in capsys.readouterr().err.splitlines() if line.startswith("notice:")]
    assert notices == [f"notice: {tmp_path / 'r.toml'} [{section}]: '{old}' is now '{new}'; the old name is read for this "
                       f"release only"]
    override = config.load_recipe(tmp_path / "r.toml", [f"{section}.{old}={value}"])
    assert getattr(getattr(override, section), new) == value


def test_a_field_help_with_square_brackets_shows_them_in_help():
    from typer.testing import CliRunner

    from clawgym.cli import app

    out = CliRunner().invoke(app, ["rollout", "--help"], terminal_width=400, env={"COLUMNS": "400"}).output
    assert "each task's [agent] timeout_sec" in out and "[rollout.<harness>] tables" in out


@pytest.mark.parametrize("key", ["timeout", "timeout_s"])
def test_the_recipe_reads_the_renamed_rollout_key(tmp_path, key):
    from clawgym.run.recipe import load_recipe

    (tmp_path / "tasks").mkdir()
    (tmp_path / "r.toml").write_text(f'[model]\ninit = "tiny"\n[rollout]\ntasks = "tasks"\n{key} = 7\n')
    assert load_recipe(tmp_path / "r.toml").rollout.timeout_s == 7.0


def test_the_old_and_new_name_of_a_rollout_key_together_are_one_clear_error(tmp_path):
    from clawgym.run.recipe import load_recipe
    from clawgym.errors import UserError

    (tmp_path / "tasks").mkdir()
    (tmp_path / "r.toml").write_text('[model]\ninit = "tiny"\n[rollout]\ntasks = "tasks"\ntimeout = 7\ntimeout_s = 8\n')
    with pytest.raises(UserError, match="give 'timeout_s' only"):
        load_recipe(tmp_path / "r.toml")



# --- measured figures live in docs/results.md, written by the commands that measure them ---------

ROOT = SRC.parent
# A measured figure in prose: a duration introduced as one ("took", "in 8.4 minutes", "about 3 min"),
# the load a run saw, a rate (tok/s, calls/s, GB/s), a Pass@1 reached, a speed ratio (x0.63, 2.8x).
# Targets and limits ("under 10 minutes", "Pass@1 above 66.7", "default 600 s") are not matched.
MEASURED = re.compile("|".join([
    r"\btook\s+(about\s+|over\s+|~)?\d",
    r"\bload average\s+(of\s+|about\s+)?\d",
    r"\bmeasured (on|once)\b",
    r"\b(about|~|in)\s*\d+(\.\d+)?([–-]\d+(\.\d+)?)?\s+(ms|s|sec|seconds|min|minutes|hours)\b",
    r"\d\s*(tok(ens)?|calls)/s\b",
    r"\d\s*[GM]B/s\b",
    r"Pass@1\s+(from\s+)?\d+(\.\d+)?\s*(→|->|to|with|after)",
    r"Pass@1\s+\d+\.\d",
    r"(?<![\w.])x\d+\.\d+\b|\b\d+\.\d+x\b",
]), re.I)


def _results_md():
    import importlib.util

    spec = importlib.util.spec_from_file_location("clawgym_bench_results_md", ROOT / "bench" / "results_md.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """Markdown's lines outside code (fenced blocks, and indented blocks after a blank line): examples of
    output may show figures."""
    out, fenced, code, prev = [], False, False, ""
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            code = line.startswith("    ") and (code or not prev.strip())
            if not code:
                out.append((i, line))
        prev = line
    return out


def _measured_in_prose() -> list[str]:
    found = []
    for p in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        if p.name in ("results.md", "config.md"):
            continue
        found += [f"{p.relative_to(ROOT)}:{i}: {m.group(0)!r}" for i, line in _prose_lines(p.read_text(encoding="utf-8"))
                  for m in MEASURED.finditer(line)]
    for p in sorted((ROOT / "recipes").glob("*.*")):
        if p.suffix in (".toml", ".sh"):
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
                if not line.startswith("#"):
                    break  # the header: the leading comment block
                found += [f"{p.relative_to(ROOT)}:{i}: {m.group(0)!r}" for m in MEASURED.finditer(line)]
    for p in [*sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py")), *sorted(SRC.rglob("*.py"))]:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{p.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}: {m.group(0)!r}"
                          for _, line in _prose_lines(ast.get_docstring(node) or "") for m in MEASURED.finditer(line)]
    return found


def test_the_measured_figure_check_tells_figures_from_targets():
    measured = ["in the measured run held-out Pass@1 went from 0 to 16.1 with SFT and to 44.3 after RL, in 8.4 minutes",
                "Pass@1 0.0 -> 64.6 after SFT", "a toy rollout took 2.8 CPU seconds", "(load average 5–15)", "took about 3 minutes",
                "OpenClaw starts slowly (about 13–45 s)", "6.9 tokens/s", "24.9 GB/s", "latency x0.63", "2.8x less time",
                "vLLM's start (about 2-10 minutes here)", "Measured on the shared 2-core machine"]
    allowed = ["in under 10 minutes on 2 cores", "held-out Pass@1 above 66.7 shows the decision learned",
               "(default 1800 s)", "8 steps × 64 rollouts", "a 10-minute GPU smoke", "exit 130 after Ctrl-C",
               "the measured run: docs/results.md", "backoff from 0.5 s",
               "check it took everything it started with it", "baselines measured in the same run",
               "the load average before and after", "a budget in 256s (the chunk size)"]
    assert [s for s in measured if not MEASURED.search(s)] == []
    assert [s for s in allowed if MEASURED.search(s)] == []


def test_readme_docs_recipe_headers_and_docstrings_quote_no_measured_figure():
    """README, docs/*.md, recipe headers and the docstrings of src/, tests/ and bench/. Figures go to docs/results.md (bench/results_md.py writes it); prose links the section."""
    assert _measured_in_prose() == []


def _command(key: str) -> list[str]:
    """A results key's argv without the wrappers around the command (env, VAR=VALUE, nice, time)."""
    argv = shlex.split(key)
    while argv:
        if argv[0] == "env" or re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0], flags=re.S):  # a quoted value may hold spaces
            argv = argv[1:]
        elif argv[0] == "nice":
            argv = argv[3:] if argv[1:2] == ["-n"] else argv[1:]
        elif argv[0].endswith("/time") or argv[0] == "time":
            argv = argv[1:]
            while argv and argv[0].startswith("-"):
                argv = argv[1:]
        else:
            return argv
    return argv


# Runs in one child process: each bench's own parser, given the arguments, with parse(ap) told to stop there.
PARSE_BENCHES = """
import json, runpy, sys
bad = {}
for key, argv in json.loads(sys.argv[1]).items():
    sys.argv = argv
    sys.path.insert(0, "bench")
    try:
        runpy.run_path(argv[0], run_name="__main__")
        bad[key] = "ran instead of stopping after parsing"
    except SystemExit as e:
        if e.code not in (0, None):
            bad[key] = f"its arguments do not parse (exit {e.code})"
print(json.dumps(bad))
"""


def _check_commands(commands: dict[str, list[str]]) -> dict[str, str]:
    """key -> why its command is not one that runs here, for those that are not."""
    import json
    import os

    from typer.testing import CliRunner

    from clawgym.cli import app

    bad, benches = {}, {}
    for key, argv in commands.items():
        paths = [a for a in argv if re.match(r"(bench|recipes|tests|scripts)/", a)]
        # a run folder, recipes/runs/NAME, and its step folders, recipes/runs/NAME/step-NNNN, are what
        # `clawgym run recipes/NAME.toml` writes (git ignores them)
        made = [a for a in paths if (m := re.fullmatch(r"recipes/runs/([\w.-]+)(/step-\d{4})?/?", a))
                and (ROOT / "recipes" / f"{m[1]}.toml").exists()]
        if missing := [a for a in paths if a not in made and not (ROOT / a).exists()]:
            bad[key] = f"no such file: {missing}"
        elif argv[:1] == ["python3"] and argv[1:2] and argv[1].startswith("bench/") and argv[1].endswith(".py"):
            benches[key] = argv[1:]
        elif argv[:3] == ["python3", "-m", "pytest"] or argv[:1] == ["bash"]:
            if not paths:
                bad[key] = "names no file of the repository"
        elif argv[:1] == ["clawgym"]:
            res = CliRunner().invoke(app, [*argv[1:], "--help"])
            if res.exit_code != 0:
                bad[key] = f"clawgym refuses it: {res.output.strip()[-300:]}"
        else:
            bad[key] = "not a bench, a pytest run, a bash script or a clawgym command"
    proc = subprocess.run([sys.executable, "-c", PARSE_BENCHES, json.dumps(benches)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, _results_md().PARSE_ONLY: "1", "PYTHONPATH": str(SRC)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {**bad, **json.loads(proc.stdout.strip().splitlines()[-1])}


def test_results_sections_are_generated_and_name_a_command_that_parses():
    rm = _results_md()
    text = (DOCS / "results.md").read_text(encoding="utf-8")
    found = rm.sections(text)
    assert found, "docs/results.md has no section"
    # nothing outside the generated sections but the generated header
    rest = re.sub(r"<!-- results: .*? -->\n.*?" + re.escape(rm.END), "", text, flags=re.S)
    assert rest.strip() == rm.HEADER.strip()
    assert _check_commands({key: _command(key) for key in found}) == {}


def test_the_command_check_refuses_what_does_not_parse():
    bad = _check_commands({k: _command(k) for k in ["python3 bench/train.py --no-such-option", "python3 bench/nope.py",
                                                    "clawgym no-such-command", "make all", "python3 bench/trees.py --rollouts 3"]})
    assert sorted(bad) == ["clawgym no-such-command", "make all", "python3 bench/nope.py", "python3 bench/train.py --no-such-option"]


def test_every_cited_results_section_exists():
    keys = set(_results_md().sections((DOCS / "results.md").read_text(encoding="utf-8")))
    cites = []
    for p in [ROOT / "README.md", *DOCS.glob("*.md"), *(ROOT / "recipes").glob("*.*"), *(ROOT / "tests").rglob("*.py"),
              *SRC.rglob("*.py")]:
        text = p.read_text(encoding="utf-8")
        cites += [(p.relative_to(ROOT), " ".join(m.group(1).split())) for m in re.finditer(r"docs/results\.md,\s+`([^`]+)`", text)]
    assert cites, "no document cites docs/results.md"
    assert [c for c in cites if c[1] not in keys] == []


def test_the_results_writer_replaces_a_section_in_place(tmp_path):
    rm = _results_md()
    path = tmp_path / "results.md"
    rm.write_section(path, "python3 bench/a.py", "one")
    rm.write_section(path, "python3 bench/b.py", "two")
    rm.write_section(path, "python3 bench/a.py", "three")
    assert rm.sections(path.read_text(encoding="utf-8")) == {"python3 bench/a.py": "## `python3 bench/a.py`\n\nthree\n",
                                                            "python3 bench/b.py": "## `python3 bench/b.py`\n\ntwo\n"}
    assert rm.command_key([str(ROOT / "bench" / "train.py"), "--harness", "--write-results"]) == "python3 bench/train.py --harness"
