"""build-trees: prefix-tree reconstruction, filtering, statistics, drawing and the command line.

Call sequences are built by hand with small token ids so that each test can say exactly where the
tree must branch and what must be kept.
"""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from clawgym.artifacts import (
    ArtifactError, CallRecord, RolloutRecord, TreeNode, delta_encode_calls, read_arrow, read_table, write_table,
)
from clawgym.cli import app
from clawgym.errors import UserError
from clawgym.trees import (
    build_rollout_tree, build_trees, draw_tree, path_to, read_trees, resolve_config, training_nodes,
)

SYSTEM = list(range(1000, 1020))  # a 20-token "system prompt"


def call(seq: int, prompt: list[int], output: list[int], *, role: str = "main", status: str = "ok",
         rollout: str = "r0", logprob: float = -0.25) -> CallRecord:
    return CallRecord(
        rollout_id=rollout, call_id=f"{rollout}-c{seq}", seq=seq, protocol="direct", model="m", started_at=float(seq),
        finished_at=float(seq) + 0.5, prompt_ids=list(prompt), output_ids=list(output),
        output_logprobs=[logprob - i / 100 for i in range(len(output))], finish_reason="stop", policy_version=0,
        role=role, status=status,
    )


def rollout(rid: str = "r0", status: str = "ok", reward: float | None = 1.0) -> RolloutRecord:
    return RolloutRecord(rid, "task", "agentloop", "task+agentloop", 0, status, reward, 0, 1.0, 0)


def paths(nodes: list[TreeNode]) -> dict[tuple[int, ...], TreeNode]:
    """Every node by the full token sequence from the root to its end."""
    out = {}
    for n in nodes:
        out[tuple(t for p in path_to(nodes, n.node_id) for t in p.token_ids)] = n
    return out


def children(nodes: list[TreeNode], node: TreeNode) -> list[TreeNode]:
    return [n for n in nodes if n.parent_id == node.node_id]


def trainable_tokens(nodes: list[TreeNode]) -> list[int]:
    return [t for n in nodes if n.trainable for t in n.token_ids]


# --- building ------------------------------------------------------------------------------------


def test_linear_chain_is_one_path_with_env_and_model_nodes():
    o0, t1, o1, t2, o2 = [1, 2], [3, 4, 5], [6], [7], [8, 9, 10]
    calls = [call(0, SYSTEM, o0), call(1, SYSTEM + o0 + t1, o1), call(2, SYSTEM + o0 + t1 + o1 + t2, o2)]
    for encoded in (calls, delta_encode_calls(calls)):
        tree = build_rollout_tree(encoded)
        nodes = tree.nodes
        assert [(n.kind, n.token_ids) for n in nodes] == [
            ("env", SYSTEM), ("model", o0), ("env", t1), ("model", o1), ("env", t2), ("model", o2)]
        assert [n.parent_id for n in nodes] == [-1, 0, 1, 2, 3, 4]
        assert [n.depth for n in nodes] == [0, 20, 22, 25, 26, 27]
        assert all(n.kept and n.drop_reason == "" for n in nodes)
        assert trainable_tokens(nodes) == o0 + o1 + o2
        assert nodes[1].logprobs == pytest.approx([-0.25, -0.26])
        assert [n.call_id for n in nodes] == ["r0-c0", "r0-c0", "r0-c1", "r0-c1", "r0-c2", "r0-c2"]
        s = tree.stats
        assert (s.calls, s.leaves, s.segments, s.kept_leaves, s.dropped_leaves) == (3, 1, 1, 1, {})
        assert s.tree_tokens == 30
        assert s.call_tokens == (20 + 2) + (25 + 1) + (27 + 3) == 78
        assert s.tree_token_ratio == pytest.approx(30 / 78)


def test_regenerated_turn_leaves_a_dead_leaf_that_is_dropped():
    # Turn 1 is sampled twice (the harness rejected a malformed tool call); only the second goes on.
    bad, good, tool, last = [50, 51, 52], [60, 61], [70, 71], [80]
    calls = [call(0, SYSTEM, bad), call(1, SYSTEM, good), call(2, SYSTEM + good + tool, last)]
    tree = build_rollout_tree(calls)
    by_path = paths(tree.nodes)
    dead = by_path[tuple(SYSTEM + bad)]
    assert (dead.kind, dead.kept, dead.drop_reason, dead.call_id) == ("model", False, "dead_leaf", "r0-c0")
    assert trainable_tokens(tree.nodes) == good + last
    assert tree.stats.leaves == 2 and tree.stats.kept_leaves == 1
    assert tree.stats.dropped_leaves == {"dead_leaf": 1}


def test_engine_error_retry_adds_no_leaf_and_no_model_tokens():
    calls = [call(0, SYSTEM, [], status="engine_error"), call(1, SYSTEM, [5, 6]), call(2, SYSTEM + [5, 6, 7], [8])]
    tree = build_rollout_tree(calls)
    assert tree.stats.failed_calls == 1
    assert tree.stats.leaves == 1 and tree.stats.dropped_leaves == {}
    assert trainable_tokens(tree.nodes) == [5, 6, 8]


def test_cancelled_call_tokens_are_never_trained_even_on_the_kept_path():
    # A stream cut short after [5, 6]; the harness echoes the partial text and goes on.
    calls = [call(0, SYSTEM, [5, 6], status="cancelled"), call(1, SYSTEM + [5, 6, 7], [8, 9])]
    tree = build_rollout_tree(calls)
    partial = paths(tree.nodes)[tuple(SYSTEM + [5, 6])]
    assert (partial.kind, partial.kept, partial.drop_reason) == ("model", False, "failed_call")
    assert trainable_tokens(tree.nodes) == [8, 9]
    # The packer still gets the partial tokens as context of the trained ones.
    assert [n.token_ids for n in training_nodes(tree.nodes)] == [SYSTEM, [5, 6], [7], [8, 9]]


def test_sampled_tokens_that_match_an_env_run_become_model_tokens():
    # Call 1's prompt holds [5, 6, 7] as harness text; call 2 later samples [5, 6] at the same place.
    calls = [call(0, SYSTEM + [5, 6, 7], [8]), call(1, SYSTEM, [5, 6])]
    tree = build_rollout_tree(calls)
    by_path = paths(tree.nodes)
    sampled = by_path[tuple(SYSTEM + [5, 6])]
    assert (sampled.kind, sampled.call_id, sampled.logprobs) == ("model", "r0-c1", pytest.approx([-0.25, -0.26]))
    assert by_path[tuple(SYSTEM + [5, 6, 7])].kind == "env"
    assert sum(len(n.token_ids) for n in tree.nodes) == 24


def test_reserialized_history_branches_at_exactly_the_first_differing_token():
    out0 = [40, 41, 42, 43, 44]
    retokenized = [40, 41, 99, 43, 44]  # the harness sent the answer back re-tokenised
    calls = [call(0, SYSTEM, out0), call(1, SYSTEM + retokenized + [7], [8])]
    tree = build_rollout_tree(calls)
    by_path = paths(tree.nodes)
    branch = by_path[tuple(SYSTEM + [40, 41])]
    assert branch.kind == "model" and branch.depth == 20
    kids = children(tree.nodes, branch)
    assert sorted((k.kind, k.token_ids) for k in kids) == [("env", [99, 43, 44, 7]), ("model", [42, 43, 44])]
    # And in the prompt: a changed system prompt branches inside the env run.
    changed = SYSTEM[:5] + [5555] + SYSTEM[6:]
    tree2 = build_rollout_tree([call(0, SYSTEM, [1]), call(1, changed, [2])])
    root = tree2.nodes[0]
    assert root.token_ids == SYSTEM[:5]
    assert sorted(k.token_ids[0] for k in children(tree2.nodes, root)) == [SYSTEM[5], 5555]


def test_compaction_starts_a_new_segment_and_both_main_trajectories_are_kept():
    o0, t0, o1 = [1, 2], [3], [4, 5]
    history = SYSTEM + o0 + t0 + o1
    summary = [90, 91, 92]
    calls = [
        call(0, SYSTEM, o0),
        call(1, SYSTEM + o0 + t0, o1),
        call(2, history + [66, 67], summary, role="compaction"),  # "summarise the conversation"
        call(3, SYSTEM + [88] + summary, [6]),  # the compacted context: system + summary
        call(4, SYSTEM + [88] + summary + [6, 7], [8, 9]),
    ]
    tree = build_rollout_tree(calls)
    s = tree.stats
    assert (s.segments, s.kept_leaves, s.leaves) == (2, 2, 3)
    assert s.dropped_leaves == {"compaction": 1}
    by_path = paths(tree.nodes)
    compaction = by_path[tuple(history + [66, 67] + summary)]
    assert (compaction.role, compaction.kept, compaction.drop_reason, compaction.segment) == ("compaction", False, "compaction", 0)
    assert by_path[tuple(SYSTEM + [88] + summary + [6])].segment == 1
    assert sorted(trainable_tokens(tree.nodes)) == sorted(o0 + o1 + [6, 8, 9])


def test_subagent_is_a_separate_branch_that_is_not_trainable():
    shared = SYSTEM[:3]  # both system prompts open with the same template tokens
    sub_system = shared + [2000, 2001, 2002]
    calls = [
        call(0, SYSTEM, [1, 2]),
        call(1, sub_system, [30, 31], role="subagent"),
        call(2, sub_system + [30, 31, 32], [33], role="subagent"),
        call(3, SYSTEM + [1, 2, 3], [4]),
        call(4, SYSTEM[:4], [77], role="aux"),  # e.g. title generation
    ]
    tree = build_rollout_tree(calls)
    by_path = paths(tree.nodes)
    assert by_path[tuple(shared)].role == "main" and by_path[tuple(shared)].kept
    for key in (sub_system, sub_system + [30, 31], sub_system + [30, 31, 32, 33]):
        node = by_path[tuple(key)]
        assert (node.role, node.kept, node.drop_reason, node.trainable) == ("subagent", False, "subagent", False)
    assert by_path[tuple(SYSTEM[:4] + [77])].drop_reason == "aux"
    assert trainable_tokens(tree.nodes) == [1, 2, 4]
    assert tree.stats.dropped_leaves == {"aux": 1, "subagent": 1}


def test_a_path_an_aux_call_wrote_first_becomes_main_when_the_main_agent_goes_through_it():
    # The aux call's answer [6] is what the main agent's history holds at that very place.
    calls = [call(0, SYSTEM + [5], [6], role="aux"), call(1, SYSTEM + [5, 6, 7], [8])]
    tree = build_rollout_tree(calls)
    assert [(n.role, n.kind, n.token_ids) for n in tree.nodes] == [
        ("main", "env", SYSTEM + [5]), ("main", "model", [6]), ("main", "env", [7]), ("main", "model", [8])]
    assert trainable_tokens(tree.nodes) == [6, 8] and tree.stats.leaves == 1


def test_over_branched_rollout_is_dropped_whole():
    calls = [call(i, SYSTEM, [100 + i]) for i in range(5)]
    assert build_rollout_tree(calls, max_leaves=5).stats.decision == "kept"
    tree = build_rollout_tree(calls, max_leaves=4)
    assert tree.stats.decision == "over_branching" and tree.stats.leaves == 5
    assert all(not n.kept and n.drop_reason == "over_branching" for n in tree.nodes)
    assert tree.stats.trainable_tokens == 0 and tree.stats.dropped_leaves == {"over_branching": 5}


@pytest.mark.parametrize("status,reward", [("infra_error", None), ("infra_error", 0.0), ("ok", None)])
def test_excluded_rollout_has_no_trainable_tokens(status, reward):
    calls = [call(0, SYSTEM, [1, 2]), call(1, SYSTEM + [1, 2, 3], [4])]
    tree = build_rollout_tree(calls, rollout("r0", status, reward))
    assert tree.stats.decision == "excluded_rollout" and tree.stats.trainable_tokens == 0
    assert all(not n.trainable and n.drop_reason == "excluded_rollout" for n in tree.nodes)
    assert len(tree.nodes) == 4  # still built, for inspection


def test_timeout_rollout_is_still_trained():
    tree = build_rollout_tree([call(0, SYSTEM, [1, 2])], rollout("r0", "timeout", 0.0))
    assert tree.stats.decision == "kept" and tree.stats.trainable_tokens == 2


# --- every call is a path; every distinct prefix is stored once -----------------------------


@st.composite
def call_sequences(draw):
    """Calls that extend, cut or fork earlier calls, over a small alphabet so that tokens collide."""
    tokens = st.lists(st.integers(0, 3), max_size=6)
    calls: list[CallRecord] = []
    for seq in range(draw(st.integers(1, 10))):
        if calls and draw(st.booleans()):
            base = draw(st.sampled_from(calls))
            full = base.prompt_ids + base.output_ids
            prompt = full[: draw(st.integers(0, len(full)))] + draw(tokens)
        else:
            prompt = draw(tokens)
        role = draw(st.sampled_from(["main", "main", "subagent", "compaction", "aux"]))
        status = draw(st.sampled_from(["ok", "ok", "ok", "engine_error", "cancelled"]))
        output = draw(tokens) if status in ("ok", "cancelled") else []
        calls.append(call(seq, prompt, output, role=role, status=status))
    return calls


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(call_sequences(), st.data())
def test_every_call_is_a_root_to_node_path_and_prefixes_are_stored_once(calls, data):
    tree = build_rollout_tree(calls)
    nodes = tree.nodes
    by_path = paths(nodes)
    full = [tuple(c.prompt_ids + c.output_ids) for c in calls]

    # Each call's prompt + output, token for token, ends exactly at a node.
    for seq in full:
        assert seq == () or seq in by_path
    # A trie: one stored token per distinct non-empty prefix of the calls, and no other.
    prefixes = {seq[:k] for seq in full for k in range(1, len(seq) + 1)}
    stored = set()
    for key, node in by_path.items():
        start = len(key) - len(node.token_ids)
        assert node.depth == start and node.token_ids
        stored.update(key[:k] for k in range(start + 1, len(key) + 1))
    assert stored == prefixes
    assert sum(len(n.token_ids) for n in nodes) == len(prefixes)
    # Parents come first; siblings start with different tokens; logprobs only on model nodes.
    for n in nodes:
        assert n.parent_id < n.node_id
        assert len(n.logprobs) == (len(n.token_ids) if n.kind == "model" else 0)
    firsts = [(n.parent_id, n.token_ids[0]) for n in nodes]
    assert len(firsts) == len(set(firsts))
    # Sampled tokens of ok calls are model tokens; whatever a main call goes through is main.
    for c in calls:
        if c.status == "ok" and c.output_ids:
            assert by_path[tuple(c.prompt_ids + c.output_ids)].kind == "model"
        if c.role == "main" and (c.prompt_ids or c.output_ids):
            end = by_path[tuple(c.prompt_ids + c.output_ids)]
            assert {n.role for n in path_to(nodes, end.node_id)} == {"main"}
    # Trainable tokens are main, kept model tokens; their ancestors are kept or a failed call's.
    by_id = {n.node_id: n for n in nodes}
    for n in nodes:
        if n.trainable:
            p = n.parent_id
            while p != -1:
                assert by_id[p].kept or by_id[p].drop_reason == "failed_call"
                p = by_id[p].parent_id
    # Delta encoding is a storage detail: the proxy's encoding, or any valid one (any earlier call
    # as base, any length up to what it shares), gives the same tree.
    assert build_rollout_tree(delta_encode_calls(calls)).nodes == nodes
    encoded = []
    for i, c in enumerate(calls):
        if i and data.draw(st.booleans()):
            base = calls[data.draw(st.integers(0, i - 1))]
            base_seq = base.prompt_ids + base.output_ids
            shared = next((k for k, (a, b) in enumerate(zip(base_seq, c.prompt_ids)) if a != b), min(len(base_seq), len(c.prompt_ids)))
            k = data.draw(st.integers(0, shared))
            c = dataclasses.replace(c, prompt_ids=c.prompt_ids[k:], prompt_base_call=base.call_id, prompt_base_len=k)
        encoded.append(c)
    assert build_rollout_tree(encoded).nodes == nodes


# --- bad input -----------------------------------------------------------------------------------


def test_bad_delta_encoding_and_logprobs_are_named():
    base = call(0, SYSTEM, [1, 2])
    unknown = dataclasses.replace(call(1, [9], [3]), prompt_base_call="nope", prompt_base_len=4)
    with pytest.raises(ArtifactError, match=r"prompt_base_call.*'r0-c1'.*'nope'"):
        build_rollout_tree([base, unknown])
    too_long = dataclasses.replace(call(1, [9], [3]), prompt_base_call="r0-c0", prompt_base_len=23)
    with pytest.raises(ArtifactError, match=r"prompt_base_len.*23 tokens.*only 22"):
        build_rollout_tree([base, too_long])
    orphan_len = dataclasses.replace(call(1, [9], [3]), prompt_base_len=3)
    with pytest.raises(ArtifactError, match=r"prompt_base_len.*no prompt_base_call"):
        build_rollout_tree([base, orphan_len])
    bad_lp = dataclasses.replace(call(1, [9], [3, 4]), output_logprobs=[-1.0])
    with pytest.raises(ArtifactError, match=r"output_logprobs.*'r0-c1'.*1 logprobs for 2 output tokens"):
        build_rollout_tree([base, bad_lp])
    with pytest.raises(ArtifactError, match=r"seq.*two calls with seq 0"):
        build_rollout_tree([base, dataclasses.replace(call(0, [9], [3]), call_id="other")])
    with pytest.raises(ArtifactError, match=r"role.*'boss'"):
        build_rollout_tree([dataclasses.replace(base, role="boss")])


def write_step(step_dir: Path, calls: list[CallRecord], rollouts: list[RolloutRecord]) -> None:
    write_table(step_dir / "calls.parquet", delta_encode_calls(calls), CallRecord)
    write_table(step_dir / "rollouts.parquet", rollouts, RolloutRecord)


def two_rollouts() -> tuple[list[CallRecord], list[RolloutRecord]]:
    a = [call(0, SYSTEM, [1, 2], rollout="a"), call(1, SYSTEM, [3], rollout="a"), call(2, SYSTEM + [3, 4], [5], rollout="a")]
    b = [call(0, SYSTEM, [6], rollout="b"), call(1, SYSTEM + [6, 7], [8, 9], rollout="b")]
    return a + b, [rollout("b"), rollout("a", "infra_error", None), rollout("empty")]


def test_table_build_equals_per_rollout_build(tmp_path):
    calls, rollouts = two_rollouts()
    write_step(tmp_path, calls, rollouts)
    built = build_trees(read_arrow(tmp_path / "calls.parquet", CallRecord), rollouts)
    rows = [TreeNode(**r) for r in built.table.to_pylist()]
    expected = []
    for r in rollouts:
        expected += build_rollout_tree([c for c in calls if c.rollout_id == r.rollout_id], r).nodes
    assert rows == expected
    assert [s.rollout_id for s in built.stats.rollouts] == ["b", "a", "empty"]
    assert [s.decision for s in built.stats.rollouts] == ["kept", "excluded_rollout", "kept"]
    assert built.stats.total("trainable_tokens") == 3


def test_calls_of_an_unknown_rollout_and_null_tokens_are_errors(tmp_path):
    calls, rollouts = two_rollouts()
    write_step(tmp_path, calls, rollouts[:1])
    with pytest.raises(ArtifactError, match=r"rollout_id.*'a'.*no row in the rollouts table"):
        build_trees(read_arrow(tmp_path / "calls.parquet", CallRecord), rollouts[:1], calls_path="calls.parquet")
    table = read_arrow(tmp_path / "calls.parquet", CallRecord)
    nulled = table.set_column(table.schema.get_field_index("output_ids"), "output_ids",
                              pa.array([None] + table.column("output_ids").to_pylist()[1:], pa.list_(pa.int32())))
    with pytest.raises(ArtifactError, match=r"calls.parquet: field 'output_ids': is null for call 'a-c0'"):
        build_trees(nulled, rollouts, calls_path="calls.parquet")


def test_resolve_config_rules(tmp_path):
    step = tmp_path / "run" / "step-0007"
    step.mkdir(parents=True)
    config = resolve_config(step, None, None, None)
    assert config.calls == str(step / "calls.parquet") and config.out == str(step / "trees.parquet")
    assert config.step == 7 and Path(config.metrics).resolve() == (tmp_path / "run" / "metrics.jsonl")
    plain = resolve_config(tmp_path, None, None, tmp_path / "x.parquet", max_leaves=3)
    assert plain.metrics is None and plain.step is None and plain.max_leaves == 3
    with pytest.raises(UserError, match="missing: --rollouts"):
        resolve_config(None, tmp_path / "c.parquet", None, tmp_path / "t.parquet")
    with pytest.raises(UserError, match="would overwrite an input"):
        resolve_config(tmp_path, None, None, tmp_path / "calls.parquet")
    with pytest.raises(UserError, match="max-leaves"):
        resolve_config(tmp_path, None, None, None, max_leaves=0)


# --- the command line and the drawing ------------------------------------------------------------


def test_cli_step_directory_form_writes_trees_config_and_metrics(tmp_path):
    calls, rollouts = two_rollouts()
    step = tmp_path / "run" / "step-0003"
    step.mkdir(parents=True)
    write_step(step, calls, rollouts)
    result = CliRunner().invoke(app, ["build-trees", str(step)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "tree_token_ratio" in result.output and "excluded_rollout" in result.output
    nodes = read_table(step / "trees.parquet", TreeNode)
    assert {n.rollout_id for n in nodes} == {"a", "b"}
    assert orjson.loads((step / "trees.config.json").read_bytes())["max_leaves"] == 64
    (line,) = [orjson.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_bytes().splitlines()]
    assert line["step"] == 3 and line["trees/rollouts"] == 3 and line["trees/rollouts_excluded"] == 1
    assert line["trees/dropped_leaves/excluded_rollout"] == 2 and line["trees/trainable_tokens"] == 3
    assert 0 < line["trees/tree_token_ratio"] < 1
    trees = read_trees(step / "trees.parquet", {"b"})
    assert list(trees) == ["b"] and [n.node_id for n in trees["b"]] == [0, 1, 2, 3]


def test_cli_file_form_and_one_line_errors(tmp_path):
    calls, rollouts = two_rollouts()
    write_step(tmp_path, calls, rollouts)
    out = tmp_path / "out" / "t.parquet"
    result = CliRunner().invoke(app, ["build-trees", "--calls", str(tmp_path / "calls.parquet"), "--rollouts",
                                      str(tmp_path / "rollouts.parquet"), "--out", str(out), "--max-leaves", "1"])
    assert result.exit_code == 0, result.output
    assert {n.drop_reason for n in read_table(out, TreeNode) if n.rollout_id == "b"} == {""}
    assert not (tmp_path / "metrics.jsonl").exists()

    # the same arguments again: the same trees, rebuilt (the step it read from the rollouts is no new setting)
    again = CliRunner().invoke(app, ["build-trees", "--calls", str(tmp_path / "calls.parquet"), "--rollouts",
                                     str(tmp_path / "rollouts.parquet"), "--out", str(out), "--max-leaves", "1"])
    assert again.exit_code == 0 and "same settings as its trees; rebuilding" in again.output, again.output

    run = subprocess.run([sys.executable, "-m", "clawgym.cli", "build-trees", "--calls", str(tmp_path / "rollouts.parquet"),
                          "--rollouts", str(tmp_path / "rollouts.parquet"), "--out", str(tmp_path / "other.parquet")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'rollouts.parquet'}: field 'kind': holds a 'rollouts' table, expected 'calls'"]


def test_draw_tree_shows_kind_role_tokens_verdict_and_words():
    calls = [call(0, SYSTEM, [50, 51, 52]), call(1, SYSTEM, [60, 61]), call(2, SYSTEM + [60, 61, 7], [8]),
             call(3, [1, 2], [3], role="subagent")]
    nodes = build_rollout_tree(calls).nodes

    class Words:
        def decode(self, ids):
            return " ".join(f"w{i}" for i in ids)

    buf = io.StringIO()
    draw_tree(nodes, Console(file=buf, width=300), tokenizer=Words())
    text = buf.getvalue()
    assert "rollout r0: 7 nodes, 3 leaves, 30 tokens, 3 trainable" in text
    assert "#1 model main · 3 tok · dropped: dead_leaf" in text
    assert "model main · 2 tok · kept (trained)" in text
    assert "env subagent · 2 tok · dropped: subagent" in text
    assert "branch 1/2" in text and "'w50 w51 w52'" in text and "'w1000 w1001" in text
    plain = io.StringIO()
    draw_tree(nodes, Console(file=plain, width=300))
    assert "w50" not in plain.getvalue() and "#6 model subagent" in plain.getvalue()
    broken = [dataclasses.replace(nodes[1], parent_id=42)]
    with pytest.raises(UserError, match="node 1 has parent_id 42"):
        draw_tree(broken, Console(file=io.StringIO()))


def test_draw_tree_decodes_with_a_real_tokenizer(request):
    pytest.importorskip("clawgym.models.tiny", reason="init-model is not in this checkout yet")
    tiny_tokenizer = request.getfixturevalue("tiny_tokenizer")
    ids = tiny_tokenizer.encode("hello world, this is the system prompt")
    nodes = build_rollout_tree([call(0, ids, tiny_tokenizer.encode(" ok"))]).nodes
    buf = io.StringIO()
    draw_tree(nodes, Console(file=buf, width=300), tokenizer=tiny_tokenizer)
    assert "hello world" in buf.getvalue()
