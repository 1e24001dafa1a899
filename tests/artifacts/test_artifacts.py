"""Artifacts: round trips, validation errors that name file and field, torn JSONL, the prompt delta codec."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawgym import artifacts as A
from clawgym.proxy import read_records

ids = st.lists(st.integers(0, 2**31 - 1), max_size=30)
text = st.text(max_size=20)
# float32 columns: draw values that survive the round trip through float32 exactly.
f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)

calls = st.builds(
    A.CallRecord,
    rollout_id=text, call_id=text, seq=st.integers(0, 10_000), protocol=st.sampled_from(A.PROTOCOLS),
    model=text, started_at=st.floats(0, 2e9), finished_at=st.floats(0, 2e9), prompt_ids=ids, output_ids=ids,
    output_logprobs=st.lists(f32, max_size=30), finish_reason=st.sampled_from(["stop", "length", "tool_calls"]),
    policy_version=st.integers(0, 1000), prompt_base_call=st.none() | text, prompt_base_len=st.integers(0, 100),
    role=st.sampled_from(A.CALL_ROLES), status=st.sampled_from(A.CALL_STATUSES), error=text, stream=st.booleans(),
    tool_names=st.lists(text, max_size=4), system_hash=text, sampling_json=st.just('{"temperature": 1.0}'),
    render_mode=st.sampled_from(["incremental", "full"]),
)
rollouts = st.builds(
    A.RolloutRecord,
    rollout_id=text, task_id=text, harness=text, group_id=text, sample_index=st.integers(0, 64),
    status=st.sampled_from(A.ROLLOUT_STATUSES), reward=st.none() | st.floats(0, 1), n_calls=st.integers(0, 500),
    wall_time_s=st.floats(0, 1e5), policy_version=st.integers(0, 1000), code_score=st.none() | st.floats(0, 1),
    rubric_score=st.none() | st.floats(0, 1), category=text, step=st.integers(0, 1000), error=text,
)
nodes = st.builds(
    A.TreeNode,
    rollout_id=text, node_id=st.integers(0, 10**6), parent_id=st.integers(-1, 10**6), token_ids=ids,
    kind=st.sampled_from(A.NODE_KINDS), logprobs=st.lists(f32, max_size=30), call_id=text,
    segment=st.integers(0, 20), role=st.sampled_from(A.CALL_ROLES), kept=st.booleans(), depth=st.integers(0, 10**6),
    drop_reason=text,
)

roundtrip_settings = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("row_type,strategy", [(A.CallRecord, calls), (A.RolloutRecord, rollouts), (A.TreeNode, nodes)])
def test_parquet_round_trip(tmp_path: Path, row_type, strategy) -> None:
    @roundtrip_settings
    @given(st.lists(strategy, max_size=8))
    def check(rows):
        path = tmp_path / f"{row_type.KIND}.parquet"
        A.write_table(path, rows, row_type)
        assert A.read_table(path, row_type) == rows
        meta = pq.read_schema(path).metadata
        assert meta[b"schema_version"] == str(A.SCHEMA_VERSION).encode()
        assert meta[b"kind"] == row_type.KIND.encode()

    check()


@roundtrip_settings
@given(st.lists(calls, max_size=8))
def test_jsonl_round_trip(tmp_path: Path, rows) -> None:
    path = tmp_path / "calls.jsonl"
    path.unlink(missing_ok=True)
    with A.JsonlWriter(path) as w:
        for r in rows:
            w.append(r)
    read = A.read_jsonl(path)
    assert read.torn == []
    assert A.rows_from_dicts(read.records, A.CallRecord) == rows


def _call(i: int, prompt: list[int], output: list[int], rollout: str = "r1") -> A.CallRecord:
    return A.CallRecord(
        rollout_id=rollout, call_id=f"c{i}", seq=i, protocol="anthropic", model="m", started_at=0.0, finished_at=1.0,
        prompt_ids=prompt, output_ids=output, output_logprobs=[-0.5] * len(output), finish_reason="stop", policy_version=0,
    )


def test_torn_last_line_yields_complete_records_and_reports_it(tmp_path: Path) -> None:
    path = tmp_path / "r1.jsonl"
    with A.JsonlWriter(path) as w:
        w.append(_call(0, [1, 2], [3]))
        w.append(_call(1, [1, 2, 3], [4]))
    full = orjson.dumps(dataclasses.asdict(_call(2, [5] * 40, [6])))
    with open(path, "ab") as f:  # a crash mid-write: half a record, no newline
        f.write(full[: len(full) // 2])
    read = A.read_jsonl(path)
    assert [r["call_id"] for r in read.records] == ["c0", "c1"]
    assert len(read.torn) == 1 and read.torn[0].line_no == 3 and read.torn[0].is_last
    # Appending after the crash starts a fresh line, so the new record is intact.
    with A.JsonlWriter(path) as w:
        w.append(_call(3, [7], [8]))
    read = A.read_jsonl(path)
    assert [r["call_id"] for r in read.records] == ["c0", "c1", "c3"]
    assert [t.line_no for t in read.torn] == [3]
    assert not read.torn[0].is_last


def test_damaged_middle_line_raises_in_strict_mode(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": \n{"a": 3}\n')
    assert [r["a"] for r in A.read_jsonl(path).records] == [1, 3]
    with pytest.raises(A.ArtifactError, match=r"m.jsonl: line 2 is not a JSON object"):
        A.read_jsonl(path, strict=True)


def test_wrong_schema_version_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.parquet"
    A.write_table(path, [], A.RolloutRecord)
    table = pq.read_table(path).replace_schema_metadata({"schema_version": "99", "kind": "rollouts"})
    pq.write_table(table, path)
    with pytest.raises(A.ArtifactError) as e:
        A.read_table(path, A.RolloutRecord)
    assert str(e.value) == f"{path}: field 'schema_version': is 99, this clawgym reads version {A.SCHEMA_VERSION}"


def test_missing_column_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "calls.parquet"
    A.write_table(path, [_call(0, [1], [2])], A.CallRecord)
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["output_ids"]).replace_schema_metadata(table.schema.metadata), path)
    with pytest.raises(A.ArtifactError) as e:
        A.read_table(path, A.CallRecord)
    assert str(e.value) == f"{path}: field 'output_ids': missing column"


def test_optional_column_missing_is_filled_with_default(tmp_path: Path) -> None:
    path = tmp_path / "calls.parquet"
    A.write_table(path, [_call(0, [1], [2])], A.CallRecord)
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["render_mode"]).replace_schema_metadata(table.schema.metadata), path)
    assert A.read_table(path, A.CallRecord)[0].render_mode == "full"


def test_wrong_kind_unknown_enum_and_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    A.write_table(path, [], A.TreeNode)
    with pytest.raises(A.ArtifactError, match=r"field 'kind': holds a 'trees' table, expected 'calls'"):
        A.read_table(path, A.CallRecord)
    bad = dataclasses.replace(_call(0, [1], [2]), status="exploded")
    A.write_table(path, [bad], A.CallRecord)
    with pytest.raises(A.ArtifactError, match=r"field 'status': unknown value\(s\) \['exploded'\]"):
        A.read_table(path, A.CallRecord)
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(A.ArtifactError, match=r"junk.parquet: not a readable Parquet file"):
        A.read_table(junk, A.CallRecord)
    with pytest.raises(A.ArtifactError, match=r"nope.parquet: no such file"):
        A.read_table(tmp_path / "nope.parquet", A.CallRecord)


def test_wrong_column_type_names_field(tmp_path: Path) -> None:
    path = tmp_path / "r.parquet"
    A.write_table(path, [], A.RolloutRecord)
    table = pq.read_table(path)
    schema = table.schema.set(table.schema.get_field_index("sample_index"), pa.field("sample_index", pa.list_(pa.string())))
    pq.write_table(pa.table({n: pa.array([], type=schema.field(n).type) for n in schema.names}).replace_schema_metadata(table.schema.metadata), path)
    with pytest.raises(A.ArtifactError, match=r"field 'sample_index': has the wrong type"):
        A.read_table(path, A.RolloutRecord)


def test_atomic_write_keeps_previous_file_when_writing_fails(tmp_path: Path) -> None:
    path = tmp_path / "trees.parquet"
    good = [A.TreeNode("r", 0, -1, [1, 2], "env", [], "c0", 0, "main", True, 0)]
    A.write_table(path, good, A.TreeNode)
    bad = [dataclasses.replace(good[0], token_ids=["not an int"])]
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        A.write_table(path, bad, A.TreeNode)
    assert A.read_table(path, A.TreeNode) == good
    assert sorted(os.listdir(tmp_path)) == ["trees.parquet"]  # no temp file left behind


# --- the prompt delta codec ----------------------------------------------------------------------

FIXTURES = Path(__file__).parents[1] / "fixtures" / "records"


def _conversation(rng_turns: list[tuple[int, int]], prefix: int = 20) -> list[A.CallRecord]:
    """A rollout whose every prompt extends the previous prompt + output by some env tokens."""
    out, prompt, tok = [], list(range(prefix)), 1000
    for i, (n_out, n_env) in enumerate(rng_turns):
        output = list(range(tok, tok + n_out))
        tok += n_out
        out.append(_call(i, list(prompt), output))
        prompt = prompt + output + list(range(tok, tok + n_env))
        tok += n_env
    return out


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _expected_delta(calls: list[A.CallRecord], j: int) -> tuple[str | None, int]:
    """The base-choice rule of artifacts/codec.py, spelled out naively: candidates are the call whose
    whole prompt this prompt starts with (the longest, the latest of equal ones) and the latest call;
    the base shares the longest prefix (the extended conversation on a tie), at least 16 tokens."""
    prompt, earlier = calls[j].prompt_ids, calls[:j]
    extended = None
    for c in earlier:
        if prompt[: len(c.prompt_ids)] == c.prompt_ids and (extended is None or len(c.prompt_ids) >= len(extended.prompt_ids)):
            extended = c
    best, best_n = None, -1
    for c in (extended, earlier[-1] if earlier else None):
        if c is not None and (n := _shared(c.prompt_ids + c.output_ids, prompt)) > best_n:
            best, best_n = c, n
    return (best.call_id, best_n) if best is not None and best_n >= A.MIN_SHARED_PREFIX else (None, 0)


@st.composite
def _rollouts(draw) -> list[A.CallRecord]:
    """Calls as harnesses make them: a turn appended to any earlier call, the same request again, a
    history cut and rewritten (compaction), an unrelated prompt (a subagent). Tokens come from a
    small alphabet, so prompts also share prefixes by chance."""
    tokens = st.lists(st.integers(0, 3), max_size=24)
    calls: list[A.CallRecord] = []
    for i in range(draw(st.integers(1, 10))):
        op = draw(st.sampled_from(["extend", "again", "rewrite", "fresh"])) if calls else "fresh"
        if op == "fresh":
            prompt = draw(st.lists(st.integers(0, 3), min_size=0, max_size=40))
        else:
            c = calls[draw(st.integers(0, len(calls) - 1))]
            seq = c.prompt_ids + c.output_ids
            if op == "extend":
                prompt = seq + draw(tokens)
            elif op == "again":
                prompt = list(c.prompt_ids)
            else:
                prompt = seq[: draw(st.integers(0, len(seq)))] + draw(tokens)
        calls.append(_call(i, prompt, draw(st.lists(st.integers(0, 3), max_size=12))))
    return calls


@settings(max_examples=300, deadline=None)
@given(_rollouts())
def test_encoding_follows_the_base_rule_and_decodes_exactly(calls) -> None:
    encoded = A.delta_encode_calls(calls)
    for j, (c, e) in enumerate(zip(calls, encoded)):
        assert (e.prompt_base_call, e.prompt_base_len) == _expected_delta(calls, j)
        assert e.prompt_ids == c.prompt_ids[e.prompt_base_len:]
    assert A.materialize_prompts(encoded) == calls


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2), max_size=700), st.lists(st.integers(0, 2), max_size=700), st.integers(0, 800))
def test_common_prefix_counts_the_shared_tokens(a, b, start) -> None:
    n = _shared(a, b)
    assert A.common_prefix(a, b) == n
    assert A.common_prefix(a, b, min(start, n)) == n  # a known-equal start only skips work


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.integers(0, 20)), min_size=1, max_size=12), st.integers(0, 40))
def test_an_appending_conversation_is_stored_against_the_previous_call(turns, prefix) -> None:
    calls = _conversation(turns, prefix)
    encoded = A.delta_encode_calls(calls)
    for prev, c, e in zip(calls, calls[1:], encoded[1:]):
        shared = len(prev.prompt_ids) + len(prev.output_ids)
        assert (e.prompt_base_call, e.prompt_base_len) == ((prev.call_id, shared) if shared >= 16 else (None, 0))
    assert A.materialize_prompts(encoded) == calls


def test_delta_encoding_branches_and_shrinks_storage() -> None:
    calls = _conversation([(5, 5)] * 10, prefix=100)
    # A retry of call 4: the same prompt as call 4, another output; stored against call 4 itself.
    retry = dataclasses.replace(calls[4], call_id="c4-retry", seq=10, output_ids=[9, 9, 9])
    encoded = A.delta_encode_calls(calls + [retry])
    stored = sum(len(c.prompt_ids) for c in encoded)
    full = sum(len(c.prompt_ids) for c in calls + [retry])
    assert stored * 3 < full
    by_id = {c.call_id: c for c in encoded}
    assert (by_id["c4-retry"].prompt_base_call, by_id["c4-retry"].prompt_base_len, by_id["c4-retry"].prompt_ids) == \
        ("c4", len(calls[4].prompt_ids), [])
    assert {c.call_id: c.prompt_ids for c in A.materialize_prompts(encoded)} == {c.call_id: c.prompt_ids for c in calls + [retry]}


def test_recorded_rollouts_decode_to_the_same_prompts_and_reencode_as_recorded() -> None:
    """Records the proxy wrote (tiny model, scripted engine): an appending agent loop, a harness that
    replaces a trailing context message every turn, and a rollout with a retried request, an
    interleaved subagent and a compacted history. They decode to the prompts whose lengths and
    hashes the fixture lists, and the offline encoder stores each prompt exactly as the proxy did."""
    expected = json.loads((FIXTURES / "full_prompts.json").read_text())
    for rollout, want in expected.items():
        recorded = read_records(FIXTURES / f"{rollout}.jsonl")
        full = A.materialize_prompts(recorded, FIXTURES / f"{rollout}.jsonl")
        got = [[c.call_id, len(c.prompt_ids), hashlib.sha256(json.dumps(c.prompt_ids).encode()).hexdigest()] for c in full]
        assert got == want, rollout
        assert sum(c.is_delta for c in recorded) >= len(recorded) - 2, rollout  # the fixtures exercise the deltas
        reencoded = A.delta_encode_calls(full)
        assert [(c.prompt_base_call, c.prompt_base_len, c.prompt_ids) for c in reencoded] == \
            [(c.prompt_base_call, c.prompt_base_len, c.prompt_ids) for c in recorded], rollout


def test_delta_encoding_takes_full_prompts_only() -> None:
    encoded = A.delta_encode_calls(_conversation([(3, 3)] * 8, prefix=20))
    with pytest.raises(ValueError, match="'c1' of rollout 'r1' is already delta-encoded"):
        A.delta_encode_calls(encoded)


def test_bad_delta_reference_is_reported() -> None:
    calls = _conversation([(3, 3)] * 3, prefix=20)
    encoded = A.delta_encode_calls(calls)
    broken = [encoded[0], dataclasses.replace(encoded[1], prompt_base_call="c-missing")]
    with pytest.raises(A.ArtifactError, match=r"calls.parquet: field 'prompt_base_call': call 'c1' of rollout 'r1' refers to 'c-missing'"):
        A.materialize_prompts(broken, "calls.parquet")
    later = [dataclasses.replace(encoded[1], prompt_base_call="c2"), encoded[2]]
    with pytest.raises(A.ArtifactError, match=r"field 'prompt_base_call': call 'c1' .* not an earlier call"):
        A.materialize_prompts(later)
    too_long = [encoded[0], dataclasses.replace(encoded[1], prompt_base_len=10_000)]
    with pytest.raises(A.ArtifactError, match=r"field 'prompt_base_len': call 'c1' \(seq 1\) of rollout 'r1' shares 10000 tokens"):
        A.materialize_prompts(too_long)
    orphan = [encoded[0], dataclasses.replace(encoded[1], prompt_base_call=None)]
    with pytest.raises(A.ArtifactError, match=r"field 'prompt_base_len': .* but no prompt_base_call"):
        A.materialize_prompts(orphan)
    with pytest.raises(A.ArtifactError, match=r"field 'seq': rollout 'r1' has two calls with seq 0"):
        A.materialize_prompts([encoded[0], dataclasses.replace(encoded[0], call_id="other")])


# --- metrics -------------------------------------------------------------------------------------


def test_metrics_lines_round_trip_and_reject_unprefixed_keys(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    A.append_metrics(path, A.MetricsLine(1, {"rollout/reward_mean": 0.25, "train/loss": 1.5}, time=3.0))
    A.append_metrics(path, A.MetricsLine(2, {"rollout/reward_mean": 0.5}))
    lines = A.read_metrics(path)
    assert [(m.step, m.values) for m in lines] == [(1, {"rollout/reward_mean": 0.25, "train/loss": 1.5}), (2, {"rollout/reward_mean": 0.5})]
    with pytest.raises(ValueError, match="metric 'loss' must start with one of"):
        A.MetricsLine(1, {"loss": 1.0})


def test_write_config_records_resolved_dataclass(tmp_path: Path) -> None:
    @dataclasses.dataclass
    class Cfg:
        lr: float = 1e-4
        path: Path = Path("x")

    A.write_config(tmp_path / "config.json", Cfg())
    assert orjson.loads((tmp_path / "config.json").read_bytes()) == {"lr": 1e-4, "path": "x"}


def test_write_config_redacts_secrets(tmp_path: Path) -> None:
    A.write_config(tmp_path / "c.json", {"judge": {"api_key": "sk-secret", "model": "j"}, "admin_token": "t0k", "n": 2,
                                         "empty_token": None})
    text = (tmp_path / "c.json").read_text()
    assert "sk-secret" not in text and "t0k" not in text
    assert orjson.loads(text) == {"judge": {"api_key": "<redacted>", "model": "j"}, "admin_token": "<redacted>", "n": 2, "empty_token": None}
