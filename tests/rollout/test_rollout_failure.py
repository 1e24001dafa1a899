"""The root cause of a failed rollout is chosen by a fixed order of evidence, not by arrival order."""

from __future__ import annotations

import itertools

import pytest

from clawgym.rollout.failure import CAUSES, Evidence, root_cause

SYMPTOMS = {
    "sandbox_gone": "its workspace folder (/tmp/x) disappeared while the rollout ran",
    "sandbox_setup": "SandboxError: cannot create a sandbox folder",
    "engine": "the last call failed there (engine exploded)",
    "infra": "ProxyUnavailable: proxy did not answer",
    "context": "prompt is 5000 tokens, the context window 4096",
    "endpoint": "model endpoint failed: Connection error.",
    "harness": "exit code 1: RuntimeError: harness bug",
    "timeout": "killed after 3 s",
}


def test_nothing_failed_is_no_cause() -> None:
    assert root_cause(Evidence()) is None


@pytest.mark.parametrize("first, second", list(itertools.permutations(SYMPTOMS, 2)))
def test_the_more_fundamental_cause_wins_whatever_arrived_first(first: str, second: str) -> None:
    ev = Evidence()
    ev.add(first, SYMPTOMS[first])
    ev.add(second, SYMPTOMS[second])
    order = list(CAUSES)
    winner = min(first, second, key=order.index)
    cause, status, text = root_cause(ev)
    assert cause == winner
    assert text.startswith(CAUSES[winner])
    # the other symptom is kept, after the cause
    loser = second if winner == first else first
    assert "; also: " in text and text.index(SYMPTOMS[loser]) > text.index("; also: ")


def test_statuses_by_cause() -> None:
    got = {}
    for cause, detail in SYMPTOMS.items():
        ev = Evidence()
        ev.add(cause, detail)
        got[cause] = root_cause(ev)[1]
    # only what the policy did is scored: its own crash and its timeout
    assert got == {"sandbox_gone": "infra_error", "sandbox_setup": "infra_error", "engine": "infra_error",
                   "infra": "infra_error", "context": "harness_error", "endpoint": "infra_error", "harness": "harness_error", "timeout": "timeout"}


def test_sandbox_gone_beats_the_relay_break_it_causes() -> None:
    """The flaky case from CI: the harness saw the broken relay before the runner saw the folder gone."""
    ev = Evidence()
    ev.add("endpoint", "model endpoint failed: Connection error.")
    ev.add("sandbox_gone", SYMPTOMS["sandbox_gone"])
    cause, status, text = root_cause(ev)
    assert (cause, status) == ("sandbox_gone", "infra_error")
    assert text == ("sandbox gone: its workspace folder (/tmp/x) disappeared while the rollout ran; "
                    "also: model endpoint failed: Connection error.")


def test_a_detail_already_naming_its_cause_is_not_repeated() -> None:
    ev = Evidence()
    ev.add("endpoint", "model endpoint failed: Connection error.")
    assert root_cause(ev)[2] == "model endpoint failed: Connection error."


def test_first_detail_of_a_cause_is_kept_and_unknown_causes_refused() -> None:
    ev = Evidence()
    ev.add("infra", "first")
    ev.add("infra", "second")
    assert root_cause(ev)[2] == "infrastructure failed: first"
    with pytest.raises(ValueError, match="unknown failure cause"):
        ev.add("cosmic_ray", "x")
