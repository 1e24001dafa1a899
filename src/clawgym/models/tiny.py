"""The embedded default policy: a tiny random-weight Qwen3-architecture model with a tool-calling chat template.

`init_model(dir, seed, size)` writes a directory that transformers loads offline with
`AutoModelForCausalLM` / `AutoTokenizer`:

- a byte-level BPE tokenizer trained with the `tokenizers` library on `data/corpus.txt` (shipped
  in the package), with the Qwen3 special tokens; `<tool_call>`, `</tool_call>`, `<tool_response>`,
  `</tool_response>`, `<think>`, `</think>` are single tokens that stay in decoded text, as in Qwen3,
  so the same tool-call parsers serve real Qwen3 models;
- our own chat template, shipped as `data/templates/chatml-tools.jinja`, following the Qwen3/Hermes
  conventions (system, user, assistant, tool roles; tool definitions in `<tools>`;
  `<tool_call>{"name":…,"arguments":…}</tool_call>` calls; consecutive tool results grouped in one
  user turn as `<tool_response>` blocks);
- random weights from `seed`, head_dim 64 (vLLM's CPU attention rejects smaller heads), a 32k
  context window, fp32 safetensors.

Deterministic: the tokenizer depends only on the corpus, the weights only on seed and size, and
every file is written in a fixed order, so the same seed and size give byte-identical files.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from clawgym.errors import UserError
from clawgym.models.templates import shipped_template

IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
# Added tokens that stay in decoded text (Qwen3 marks these special=False): parsers look for them.
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=384),
    "small": ModelSize(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=768),
}
# Every size shares one tokenizer; the shipped corpus yields ~2k tokens before merges run out.
BPE_VOCAB = 2048
HEAD_DIM = 64
CONTEXT_WINDOW = 32768

# Our own template in the Qwen3/Hermes conventions, shipped as `chatml-tools` (templates.py).
# Assistant tool-call arguments may arrive as a JSON string (OpenAI style) or an object; both
# render the same JSON text.
CHAT_TEMPLATE = shipped_template("chatml-tools").strip()


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    architecture: str
    n_params: int
    vocab_size: int
    size: str
    seed: int


def build_tokenizer(vocab_size: int):
    """Train the byte-level BPE tokenizer on the shipped corpus; returns a transformers fast tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = resources.files("clawgym").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus.splitlines(keepends=True), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        model_max_length=CONTEXT_WINDOW,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def init_model(path: str | Path, *, seed: int = 0, size: str = "tiny", force: bool = False) -> ModelInfo:
    """Write a tiny random Qwen3 model + tokenizer to `path` (see module docstring)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the CLI shows its own status line

    if size not in SIZES:
        raise UserError(f"unknown --size '{size}'; choose one of: {', '.join(SIZES)}")
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    path = Path(path)
    check_target(path, force)
    spec = SIZES[size]

    tokenizer = build_tokenizer(BPE_VOCAB)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=HEAD_DIM,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=CONTEXT_WINDOW,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        dtype="float32",
    )
    # Weights depend only on the seed: seed the global generator right before construction.
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
    )

    tmp = temp_target(path)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "clawgym.json").write_text(json.dumps({"made_by": "clawgym init-model", "size": size, "seed": seed}, indent=2) + "\n")
    publish_target(tmp, path)
    n_params = sum(p.numel() for p in model.parameters())
    return ModelInfo(path, "Qwen3ForCausalLM", n_params, len(tokenizer), size, seed)


def check_target(path: Path, force: bool) -> None:
    """A model directory may be written to `path`: absent, empty, or non-empty with --force (it is
    replaced only once the new model is complete, by `publish_target`)."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise UserError(f"{path} is not empty; pass --force to overwrite it")


def temp_target(path: Path) -> Path:
    """A fresh sibling directory to write into; `publish_target` renames it, so a crash never leaves half a model."""
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish_target(tmp: Path, path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
