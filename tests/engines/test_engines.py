"""Engines: the scripted engine's queues and tokenization, the hf engine's batching, logprobs and reload."""

from __future__ import annotations

import asyncio

import pytest
import torch

from clawgym.engines import ENGINES, EngineConfig, EngineError, Sampling, make_engine
from clawgym.engines.hf import HFEngine
from clawgym.engines.scripted import ScriptedEngine, load_script
from clawgym.errors import UserError


def run(coro):
    return asyncio.run(coro)


def test_engine_table_and_unknown_name(tiny_model):
    assert {"hf", "scripted"} <= set(ENGINES)
    with pytest.raises(UserError, match="unknown engine 'vlm'.*hf.*scripted"):
        make_engine("vlm", EngineConfig(tiny_model))


def test_scripted_tokenizes_with_real_tokenizer(tiny_model, tiny_tokenizer):
    eng = ScriptedEngine(tiny_model, {"r1": load_items(["Hello <tool_call>x</tool_call>"])})
    g = run(eng.generate([1, 2, 3], Sampling(max_tokens=100), "r1"))
    assert g.output_ids[-1] == tiny_tokenizer.eos_token_id and g.finish_reason == "stop"
    assert tiny_tokenizer.decode(g.output_ids, skip_special_tokens=True) == "Hello <tool_call>x</tool_call>"
    assert tiny_tokenizer.convert_tokens_to_ids("<tool_call>") in g.output_ids  # markup is one token
    assert g.output_logprobs == [0.0] * len(g.output_ids)


def load_items(texts):
    from clawgym.engines.scripted import ScriptItem

    return [ScriptItem(text=t) for t in texts]


def test_scripted_queues_budget_errors_and_reload(tiny_model, tmp_path):
    path = tmp_path / "script.jsonl"
    path.write_text('{"rollout_id": "a", "text": "one two three four five six"}\n'
                    '{"rollout_id": "a", "error": "engine on fire"}\n'
                    '{"text": "shared"}\n')
    eng = make_engine("scripted", EngineConfig(tiny_model, {"script": str(path)}))
    g = run(eng.generate([1], Sampling(max_tokens=3), "a"))
    assert len(g.output_ids) == 3 and g.finish_reason == "length"
    with pytest.raises(EngineError, match="engine on fire"):
        run(eng.generate([1], Sampling(max_tokens=3), "a"))
    assert run(eng.generate([1], Sampling(max_tokens=50), "b")).finish_reason == "stop"  # the shared queue
    with pytest.raises(EngineError, match="rollout 'b' is exhausted"):
        run(eng.generate([1], Sampling(max_tokens=50), "b"))
    assert eng.push("b", ["again", {"text": "slow", "delay_s": 0.01}]) == 2
    assert run(eng.generate([1], Sampling(max_tokens=50), "b")).output_ids
    assert run(eng.reload(tmp_path)) == 1 and eng.policy_version == 1


def test_script_file_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: not JSON"):
        load_script(bad)
    bad.write_text('{"rollout_id": "x", "delay_s": 1}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:1: a script item needs 'text' or 'error'"):
        load_script(bad)
    with pytest.raises(UserError, match="does not exist"):
        load_script(tmp_path / "missing.jsonl")


@pytest.fixture(scope="module")
def hf_engine(tiny_model):
    return HFEngine(tiny_model, max_batch=8, prefill_chunk=5)  # small chunks: the chunked prefill runs


def teacher_forced_logprobs(model, prompt, output, temperature):
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + output])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(output)]


def test_hf_batched_generation_logprobs_match_a_plain_forward(hf_engine):
    prompts = [[5, 6, 7] * (i + 1) for i in range(5)]  # different lengths: left padding in one batch

    async def go():
        return await asyncio.gather(*[hf_engine.generate(p, Sampling(max_tokens=6 + i, temperature=0.7 + 0.1 * i, seed=i))
                                      for i, p in enumerate(prompts)])

    gens = run(go())
    for i, (p, g) in enumerate(zip(prompts, gens)):
        assert len(g.output_ids) == 6 + i and g.finish_reason == "length" and g.policy_version == hf_engine.policy_version
        ref = teacher_forced_logprobs(hf_engine.model, p, g.output_ids, 0.7 + 0.1 * i)
        assert g.output_logprobs == pytest.approx(ref, abs=1e-4)


def test_hf_packed_layout_keeps_every_weight_and_serves_what_the_trainer_computes(tiny_model, tmp_path):
    """By default on a CPU the engine multiplies by oneDNN-packed copies of its linear weights (weight_layout.py):
    every parameter, shape and tied embedding stays the checkpoint's, the completions' logprobs match the
    checkpoint as the trainer loads it, a reload packs the new weights, and `weight_layout=rows` keeps
    plain layers that sample the same tokens."""
    from clawgym.engines.base import load_policy
    from clawgym.engines.weight_layout import PACK_MIN, available
    from clawgym.models.tiny import init_model

    if not available():
        pytest.skip("this torch was built without oneDNN weight packing (the fallback is tested in the next test)")
    ref = load_policy(tiny_model)
    eng = HFEngine(tiny_model)
    for (name, w), (_, r) in zip(eng.model.named_parameters(remove_duplicate=False), ref.named_parameters(remove_duplicate=False)):
        assert w.shape == r.shape and torch.equal(w, r), name
    linears = [m for m in eng.model.modules() if isinstance(m, torch.nn.Linear)]
    packed = [m for m in linears if type(m) is not torch.nn.Linear]
    assert packed == [m for m in linears if m.weight.numel() >= PACK_MIN] and packed  # the tiny model's head at least
    assert all(m.packed_weight.shape == m.weight.shape for m in packed)
    if ref.config.tie_word_embeddings:
        assert eng.model.get_input_embeddings().weight is eng.model.get_output_embeddings().weight
    prompts = [[5, 6, 7, 8, 9], [5, 6, 7, 10]]  # two rows: their decode steps multiply by the packed weights

    async def both(e):
        return await asyncio.gather(*[e.generate(p, Sampling(max_tokens=8, temperature=0.8, seed=3 + i))
                                      for i, p in enumerate(prompts)])

    gens = run(both(eng))
    for p, g in zip(prompts, gens):
        assert g.output_logprobs == pytest.approx(teacher_forced_logprobs(ref, p, g.output_ids, 0.8), abs=1e-4)
    # with autograd on (scoring through the engine's model) the layers take the plain path, which has a backward
    x = torch.randn(2, linears[0].in_features, requires_grad=True)
    linears[0](x).sum().backward()
    assert x.grad is not None and torch.allclose(linears[0](x.detach()), torch.nn.functional.linear(x, linears[0].weight), atol=1e-4)
    rows = HFEngine(tiny_model, weight_layout="rows")
    assert all(type(m) is torch.nn.Linear for m in rows.model.modules() if isinstance(m, torch.nn.Linear))
    assert [g.output_ids for g in run(both(rows))] == [g.output_ids for g in gens]
    other = tmp_path / "other"
    init_model(other, seed=1, size="tiny")
    run(eng.reload(other))  # a reload packs the new weights
    head = eng.model.get_output_embeddings()
    x = torch.randn(3, head.in_features)
    with torch.inference_mode():
        assert type(head) is not torch.nn.Linear and torch.allclose(head(x), torch.nn.functional.linear(x, head.weight), atol=1e-4)
    run(eng.close()), run(rows.close())
    with pytest.raises(UserError, match="weight_layout='columns': give one of packed, rows"):
        HFEngine(tiny_model, weight_layout="columns")


def test_the_worker_thread_loads_and_reloads_the_weights(tiny_model, monkeypatch):
    """Every torch call of the engine, the loads included, runs on its worker thread: one OpenMP pool
    (docs/engines.md, Threads); a load that fails there is raised by the constructor."""
    import threading

    from clawgym.engines import hf

    seen, real = [], hf.load_policy
    monkeypatch.setattr(hf, "load_policy", lambda path, device="cpu": seen.append(threading.current_thread().name) or real(path, device))
    eng = HFEngine(tiny_model)
    assert run(eng.reload(tiny_model)) == 1
    run(eng.close())
    assert seen == ["clawgym-hf-engine"] * 2
    with pytest.raises(UserError, match="not a model directory"):
        HFEngine(tiny_model / "missing")


def test_pack_linears_unpacks_where_the_packed_product_disagrees(tiny_model, monkeypatch):
    """A torch without oneDNN packing, one whose packed product differs from the plain one (checked on a probe),
    or one whose oneDNN refuses a weight, leaves every layer plain."""
    from clawgym.engines import weight_layout
    from clawgym.engines.base import load_policy

    model = load_policy(tiny_model)
    with monkeypatch.context() as m:  # a torch without oneDNN packing (checked on every machine): plain layers
        m.setattr(weight_layout, "available", lambda: False)
        assert weight_layout.pack_linears(model) == 0
        assert all(type(x) is torch.nn.Linear for x in model.modules() if isinstance(x, torch.nn.Linear))
    if not weight_layout.available():
        pytest.skip("this torch was built without oneDNN weight packing: the packing paths below cannot run")
    monkeypatch.setattr(weight_layout, "_agrees", lambda module: False)
    assert weight_layout.pack_linears(model) == 0
    assert all(type(m) is torch.nn.Linear and not hasattr(m, "packed_weight")
               for m in model.modules() if isinstance(m, torch.nn.Linear))
    monkeypatch.undo()

    def refuse(weight):
        raise RuntimeError("could not create a primitive descriptor")

    monkeypatch.setattr(weight_layout, "pack", refuse)  # oneDNN refusing a weight: same, no error
    assert weight_layout.pack_linears(model) == 0
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    monkeypatch.undo()
    assert weight_layout.pack_linears(model) > 0


def test_hf_seed_greedy_and_stop_ids(hf_engine):
    s = Sampling(max_tokens=8, temperature=1.0, seed=11)
    a, b = run(hf_engine.generate([9, 10, 11], s)), run(hf_engine.generate([9, 10, 11], s))
    assert a.output_ids == b.output_ids  # same seed, same sample
    greedy = run(hf_engine.generate([9, 10, 11], Sampling(max_tokens=8, temperature=0.0)))
    stop = greedy.output_ids[2]
    cut = run(hf_engine.generate([9, 10, 11], Sampling(max_tokens=8, temperature=0.0, stop_token_ids=(stop,))))
    assert cut.finish_reason == "stop" and cut.output_ids[-1] == stop
    assert cut.output_ids == greedy.output_ids[: greedy.output_ids.index(stop) + 1]
    assert run(hf_engine.generate([9], Sampling(max_tokens=0))).output_ids == []


def test_hf_reload_bumps_version_and_changes_weights(tiny_model, tmp_path):
    from clawgym.models.tiny import init_model

    eng = HFEngine(tiny_model)
    other = tmp_path / "other"
    init_model(other, seed=1, size="tiny")
    s = Sampling(max_tokens=6, temperature=0.0)
    before = run(eng.generate([5, 6, 7], s))
    assert run(eng.reload(other)) == 1
    after = run(eng.generate([5, 6, 7], s))
    assert after.policy_version == 1 and before.policy_version == 0
    assert after.output_logprobs != before.output_logprobs
    with pytest.raises(UserError, match="not a model directory"):
        run(eng.reload(tmp_path / "nope"))
    assert eng.policy_version == 1
    run(eng.close())
    with pytest.raises(EngineError, match="shut down"):
        run(eng.generate([1], s))


def test_hf_admits_long_prompts_alone():
    from collections import deque

    from clawgym.engines.hf_batching import Job, admissible

    def jobs(*lengths):
        return deque(Job([1] * n, Sampling(max_tokens=1), None, None) for n in lengths)

    lens = lambda taken: [len(j.prompt_ids) for j in taken]  # noqa: E731
    waiting = jobs(40_000, 100, 120, 30_000, 90)
    assert lens(admissible(waiting, 0, 0, 8, 65536)) == [40_000]  # an empty batch always takes the first
    assert lens(admissible(waiting, 1, 40_000, 8, 65536)) == []  # nothing joins a 40k-wide batch
    assert lens(admissible(waiting, 0, 0, 8, 65536)) == [100, 120]  # first come, first served: 30k waits
    assert lens(admissible(waiting, 2, 130, 8, 65536)) == []
    assert lens(admissible(waiting, 0, 0, 8, 65536)) == [30_000, 90]  # 2 rows x 30k fit 65536
    assert lens(admissible(jobs(5, 5, 5), 6, 50, 8, 65536)) == [5, 5]  # max_batch rows


async def _late(engine, early, late):
    """Start `early`, and send `late` once `early` has run a few decode steps; both results, late first done."""
    first = asyncio.ensure_future(engine.generate(*early))
    start = engine.decode_steps
    while engine.decode_steps < start + 3:
        assert not first.done()
        await asyncio.sleep(0.005)
    second = await engine.generate(*late)
    assert not first.done()  # the late request was answered while the early one still ran
    return await first, second


@pytest.mark.slow
@pytest.mark.parametrize("late_prompt", [[4, 5], list(range(3, 40))], ids=["narrower", "wider"])
def test_hf_late_request_joins_at_a_step_and_equals_running_alone(tiny_model, late_prompt):
    """A request arriving mid-generation joins the running batch (left-padded into its cache, or widening
    it) and samples exactly what it samples alone, greedy and seeded; the running request too."""
    engine = HFEngine(tiny_model, max_batch=8)
    early = ([7, 8, 9, 10, 11, 12], Sampling(max_tokens=24, temperature=1.0, seed=3))
    lates = [(late_prompt, Sampling(max_tokens=5, temperature=0.0)),
             (late_prompt, Sampling(max_tokens=5, temperature=0.9, seed=5))]
    for late in lates:
        a, b = run(_late(engine, early, late))
        alone_a, alone_b = run(engine.generate(*early)), run(engine.generate(*late))
        for got, alone in ((a, alone_a), (b, alone_b)):
            assert got.output_ids == alone.output_ids and got.finish_reason == alone.finish_reason
            assert got.output_logprobs == pytest.approx(alone.output_logprobs, abs=1e-5)
        assert len(a.output_ids) == 24 and len(b.output_ids) == 5
    run(engine.close())


@pytest.mark.slow
def test_hf_without_late_admission_waits_for_the_batch(tiny_model):
    engine = HFEngine(tiny_model, late_admission=False)
    early = ([7, 8, 9], Sampling(max_tokens=30, temperature=0.0))

    async def go():
        first = asyncio.ensure_future(engine.generate(*early))
        while engine.decode_steps < 3:
            await asyncio.sleep(0.005)
        second = await engine.generate([4, 5], Sampling(max_tokens=2, temperature=0.0))
        return first.done(), second

    first_done, second = run(go())
    assert first_done and len(second.output_ids) == 2
    run(engine.close())


def test_hf_stops_a_cancelled_request_and_close_abandons_what_runs(tiny_model):
    """A caller that goes away (a harness killed on timeout) stops its row's decoding; close() ends the
    worker at once, failing what still runs, so no torch work outlives the engine."""
    engine = HFEngine(tiny_model, max_batch=8)
    long = Sampling(max_tokens=100_000, temperature=1.0, seed=1)

    async def go():
        job = asyncio.ensure_future(engine.generate([7, 8, 9], long))
        while engine.decode_steps < 3:
            await asyncio.sleep(0.005)
        job.cancel()
        short = await engine.generate([4, 5], Sampling(max_tokens=2, temperature=0.0))
        steps = engine.decode_steps
        await asyncio.sleep(0.3)
        assert engine.decode_steps == steps  # nothing decodes for the cancelled request any more
        running = asyncio.ensure_future(engine.generate([7, 8, 9], long))
        while engine.decode_steps < steps + 3:
            await asyncio.sleep(0.005)
        await engine.close()
        with pytest.raises(EngineError, match="shut down"):
            await running
        return short

    assert len(run(go()).output_ids) == 2
