"""Why a rollout failed: the root cause among several symptoms, chosen by a fixed order of evidence.

One broken thing shows up in several places at once, in whatever order the machine happens to
schedule them. A sandbox folder deleted under a running harness also breaks the harness's relay to
the proxy, so the harness may report "model endpoint failed" before the runner notices the missing
folder; an engine that fails makes the harness give up or run out of time. Reporting the first
symptom to arrive would blame an engine outage that never happened, and would make the outcome
depend on load. So the runner first gathers every piece of evidence into `Evidence`, then
`root_cause` picks one by this order (most fundamental first):

1. sandbox gone       the sandbox's folders vanished while the rollout ran       infra_error
2. sandbox setup      the proxy registration or the sandbox could not be made     infra_error
3. engine failed      the rollout's last answered call failed in the engine       infra_error
4. infrastructure     the proxy became unreachable, records were lost, a bug      infra_error
5. context overflow   the last request did not fit the model's context window     harness_error (scored)
6. endpoint           the harness's own word that its model endpoint failed       infra_error
7. harness crashed    the harness exited on its own with an error                 harness_error (scored)
8. call budget        it asked for a call past [rollout] max_calls; the harness   timeout (scored)
                      ended on that refusal
9. timeout            the wall-clock limit killed the harness                     timeout (scored)

A harness that says its model endpoint failed reports a symptom, ranked below every cause that
would explain it: a context overflow is refused with an error the harness may call an endpoint
failure, but it is the policy's own ending (its conversation grew too long), so it is scored. The chosen cause starts the error text (`CAUSES` names it);
the other symptoms follow after "; also: " so nothing observed is hidden.
docs/reliability.md lists what each fault produces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CAUSES: dict[str, str] = {
    # cause key → (the text the error starts with); the order of this dict is the order of evidence
    "sandbox_gone": "sandbox gone",
    "sandbox_setup": "sandbox setup failed",
    "engine": "model engine failed",
    "infra": "infrastructure failed",
    "context": "context_length_exceeded",
    "endpoint": "model endpoint failed",
    "harness": "harness crashed",
    "budget": "call budget spent",
    "timeout": "timeout",
}

_STATUS = {"sandbox_gone": "infra_error", "sandbox_setup": "infra_error", "engine": "infra_error",
           "infra": "infra_error", "context": "harness_error", "endpoint": "infra_error", "harness": "harness_error",
           "budget": "timeout", "timeout": "timeout"}


@dataclass
class Evidence:
    """Every symptom one rollout showed, keyed by cause; filled in as the rollout runs, judged once at the end."""

    found: dict[str, str] = field(default_factory=dict)
    """cause key (one of CAUSES) → its detail text"""

    def add(self, cause: str, detail: str) -> None:
        if cause not in CAUSES:
            raise ValueError(f"unknown failure cause {cause!r}; known: {', '.join(CAUSES)}")
        self.found.setdefault(cause, detail)  # the first detail of a cause is the one kept


def root_cause(evidence: Evidence) -> tuple[str, str, str] | None:
    """(cause key, rollout status, error text) of the most fundamental cause, or None when nothing failed."""
    present = [c for c in CAUSES if c in evidence.found]
    if not present:
        return None
    cause = present[0]
    text = _line(cause, evidence.found[cause])
    others = [_line(c, evidence.found[c]) for c in present[1:]]
    if others:
        text += "; also: " + "; ".join(others)
    return cause, _STATUS[cause], text


def _line(cause: str, detail: str) -> str:
    head = CAUSES[cause]
    if not detail:
        return head
    # a harness that reports "model endpoint failed: X" would otherwise read twice
    return detail if detail.startswith(head) else f"{head}: {detail}"
