"""Every common decoder architecture trains on the tree path: a matrix over tiny random configs.

For each architecture: packed-tree logprobs (segment, dense and flex attention, two trees in one padded
micro-batch) equal each root-to-leaf path's own logprobs to 1e-5, the trainer's self-test accepts
it, and the default `clawgym train` runs GRPO and PPO on a real step directory. Sliding windows
(4 tokens) are far shallower than the trees, and soft-caps / logit scales are set strong enough to
matter, so each feature is exercised. Architectures the tree path cannot train are refused in one
line before any work. docs/models.md holds the resulting table.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import transformers as T

from clawgym.train.attention import implementation
from clawgym.train.packing import PackedPolicy, collate, pack_tree
from clawgym.train.support import self_test, sliding_window
from test_train_loop import run_cli, step  # noqa: F401 - `step` is a fixture used below
from test_train_packing import per_path_logprobs, random_tree, scored_positions

VOCAB = 512
BASE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, head_dim=16, pad_token_id=0, bos_token_id=1, eos_token_id=2)
WINDOW = 4
# name → (config class, what differs from BASE). The windows, caps and scales are the features under test.
ARCHS = {
    "llama": (T.LlamaConfig, {}),
    "qwen2": (T.Qwen2Config, {}),
    "qwen3": (T.Qwen3Config, {}),
    "qwen3_moe": (T.Qwen3MoeConfig, {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
    "mistral": (T.MistralConfig, {"sliding_window": WINDOW}),
    "gemma": (T.GemmaConfig, {}),
    "gemma2": (T.Gemma2Config, {"sliding_window": WINDOW, "attn_logit_softcapping": 0.3, "final_logit_softcapping": 0.5}),
    "gemma3": (T.Gemma3TextConfig, {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]}),
    "phi3": (T.Phi3Config, {}),
    "olmo2": (T.Olmo2Config, {}),
    "granite": (T.GraniteConfig, {"logits_scaling": 4.0}),
    "smollm3": (T.SmolLM3Config, {}),
    "cohere2": (T.Cohere2Config, {"sliding_window": WINDOW, "logit_scale": 4.0}),
}


def make_config(name: str):
    cls, extra = ARCHS[name]
    return cls(**{**BASE, **extra})


def make_lm(name: str):
    torch.manual_seed(0)
    return T.AutoModelForCausalLM.from_config(make_config(name), attn_implementation=implementation("segments")).eval()


@pytest.mark.parametrize("name", ARCHS)
def test_packed_logprobs_equal_per_path(name):
    lm = make_lm(name)
    rng = random.Random(5)
    a = pack_tree(random_tree(rng, 9, "a", max_len=8, roots=2, vocab=VOCAB), only_trainable=False)
    b = pack_tree(random_tree(rng, 5, "b", vocab=VOCAB), only_trainable=False)
    window = sliding_window(lm.config)
    if window is not None:
        assert int(a.position_ids.max()) > window + 2  # the window drops keys of these paths
    policy = PackedPolicy(lm)
    with torch.no_grad():
        ref = torch.cat([per_path_logprobs(lm, t)[scored_positions(t)] for t in (a, b)])
        # flex runs FlexAttention eagerly here (forward only on CPU); its windows are per layer, as HF's
        for attention in ("segments", "dense", "flex"):
            mb = collate([a, b], [0, 1], attention=attention)
            logp, _ = policy(mb)
            torch.testing.assert_close(logp, ref, atol=1e-5, rtol=0)
            assert mb.attention_mask.uses == lm.config.num_hidden_layers  # every layer ran tree attention
    self_test(lm, "segments")
    self_test(lm, "dense")
    self_test(lm, "flex")


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory, tiny_model) -> dict[str, Path]:
    """Each architecture saved as a model directory with the tiny model's tokenizer beside it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    dirs = {}
    for name in ARCHS:
        d = tmp_path_factory.mktemp("archs") / name
        make_lm(name).save_pretrained(d)
        tok.save_pretrained(d)
        dirs[name] = d
    return dirs


@pytest.mark.slow
@pytest.mark.parametrize("name", ARCHS)
def test_default_cli_train_runs_grpo_and_ppo(name, arch_dirs, step, tmp_path, monkeypatch, capsys):  # noqa: F811
    for algo in ("grpo", "ppo"):
        out = tmp_path / algo
        code, err = run_cli(["train", str(step), "--model", str(arch_dirs[name]), "--out", str(out), "--algo", algo,
                             "--lr", "1e-3", "--metrics", str(tmp_path / f"{algo}.jsonl")], monkeypatch, capsys)
        assert code in (0, None), err
        assert json.loads((out / "trainer_state.json").read_text())["complete"]
        if algo == "ppo":
            assert (out / "value" / "value_head.safetensors").exists()
        T.AutoModelForCausalLM.from_pretrained(out)  # the engine can load what was written


def test_state_carrying_layers_are_refused_before_any_work(step, tmp_path, monkeypatch, capsys):  # noqa: F811
    model = tmp_path / "hybrid"
    T.Qwen3NextConfig(**BASE, layer_types=["linear_attention", "full_attention"]).save_pretrained(model)  # config only
    code, err = run_cli(["train", str(step), "--model", str(model), "--out", str(tmp_path / "c")], monkeypatch, capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "qwen3_next" in err and "linear_attention layers" in err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("cls, why", [
    (T.StableLmConfig, "do not receive keyword arguments"),  # its layers never see the plan
    (T.GptOssConfig, "attention sinks"),  # learned sinks: an extra softmax column tree attention lacks
])
def test_the_self_test_refuses_what_no_config_field_says(cls, why):
    from clawgym.errors import UserError

    torch.manual_seed(0)
    lm = T.AutoModelForCausalLM.from_config(cls(**BASE), attn_implementation=implementation("segments")).eval()
    with pytest.raises(UserError, match=why):
        self_test(lm, "segments")


