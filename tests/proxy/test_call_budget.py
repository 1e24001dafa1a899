"""`[rollout] max_calls`: the proxy refuses a rollout's call past its budget in each protocol's own
400 shape (through the real SDKs), and a rollout that runs into it is scored as the harness left it
(status timeout, the bound named in its error), from `clawgym rollout --max-calls` and recipes alike."""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai
import pytest

from clawgym.run.recipe import load_recipe
from clawgym.errors import UserError
from clawgym.proxy.client import ProxyUnavailable
from clawgym.rollout.runner import run_rollouts

from helpers import CHECK_HI, make_task, script, scripted_config, tool_call


def test_a_call_past_the_budget_is_refused_in_each_protocols_shape(proxy) -> None:
    reg = proxy.register("budget", script=["one", "two"], max_calls=2)
    o = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    a = anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0)
    ask = dict(model="m", messages=[{"role": "user", "content": "hi"}])
    assert o.chat.completions.create(**ask).choices[0].message.content == "one"
    assert proxy.settle("budget")["call_budget_spent"] == ""  # within the budget: nothing refused yet
    assert a.messages.create(max_tokens=5, **ask).content[0].text == "two"
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as ec:
            o.chat.completions.create(stream=stream, **ask)
        assert ec.value.code == "call_budget_exhausted" and "budget of 2 model calls is spent" in ec.value.message
        with pytest.raises(openai.BadRequestError) as er:
            o.responses.create(model="m", input="hi", stream=stream)
        assert er.value.code == "call_budget_exhausted"
        with pytest.raises(anthropic.BadRequestError) as ea:
            a.messages.create(max_tokens=5, stream=stream, **ask)
        assert ea.value.body["error"]["type"] == "invalid_request_error"
    st = proxy.settle("budget")
    assert st["calls_started"] == 2 and st["calls_recorded"] == 2  # a refused request is not a call: nothing sampled
    assert st["call_budget_spent"] == "this rollout's budget of 2 model calls is spent"
    # another rollout of the same proxy has its own budget, and none unless it asks for one
    free = proxy.register("free", script=["a", "b", "c"])
    o2 = openai.OpenAI(base_url=free["openai_base_url"], api_key=free["api_key"], max_retries=0)
    assert [o2.chat.completions.create(**ask).choices[0].message.content for _ in range(3)] == ["a", "b", "c"]


@pytest.mark.parametrize("bad", [-1, "3", True, 2.5])
def test_a_bad_budget_is_refused_at_registration(proxy, bad) -> None:
    with pytest.raises(ProxyUnavailable, match=r"HTTP 400 .*max_calls must be an integer >= 0 \(0: no bound\)"):
        proxy.admin("POST", "/admin/rollouts", {"rollout_id": f"bad-{bad}", "max_calls": bad})


@pytest.mark.slow
def test_a_rollout_that_spends_its_budget_is_scored_as_it_stands(tmp_path: Path, tiny_model: Path) -> None:
    make_task(tmp_path / "tasks", "loop", check=CHECK_HI)
    make_task(tmp_path / "tasks", "quick", check=CHECK_HI)
    # `loop` writes its answer, then keeps calling tools; `quick` ends within the budget
    looping = [tool_call("bash", command="echo hi > out.txt")] + [tool_call("bash", command="ls")] * 6 + ["Done."]
    s = script(tmp_path / "script.jsonl", {"loop.agentloop.0": looping,
                                            "quick.agentloop.0": [tool_call("bash", command="echo hi > out.txt"), "Done."]})
    rows = {r.task_id: r for r in run_rollouts(scripted_config(tmp_path, tiny_model, s, max_calls=3)).rollouts}
    loop, quick = rows["loop"], rows["quick"]
    assert loop.status == "timeout" and loop.n_calls == 3
    assert loop.error.startswith("call budget spent: 3 model calls ([rollout] max_calls)")
    assert loop.reward == 1.0  # scored on the workspace it left, like a timeout: not excluded
    assert quick.status == "ok" and quick.n_calls == 2 and quick.error == "" and quick.reward == 1.0


def test_the_recipe_key_reaches_rollouts_and_evaluations(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    recipe = tmp_path / "r.toml"
    recipe.write_text('[model]\ninit = "tiny"\n\n[rollout]\ntasks = "tasks"\nmax_calls = 12\n\n[eval]\nevery = 1\n')
    r = load_recipe(recipe)
    assert r.rollout_config(tmp_path / "s", 1, 0).max_calls == 12
    assert r.eval_config(tmp_path / "e", 0, "e.").max_calls == 12
    assert load_recipe(recipe, ["rollout.max_calls=0"]).rollout_config(tmp_path / "s", 1, 0).max_calls == 0
    with pytest.raises(UserError, match=r"\[rollout\] key .max_calls. must be >= 0, got -1"):
        load_recipe(recipe, ["rollout.max_calls=-1"])
