"""`ProxyConfig`: what one proxy serves and how, each field with its default and help.

The fields are `clawgym serve-proxy`'s options (cli/stages.py, `clawgym.fields`) and its table in
docs/config.md. This module imports neither aiohttp nor an engine, so the command line builds the
options without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawgym.engines.registry import ENGINES
from clawgym.fields import KEY_VALUES, option
from clawgym.proxy.toolparse import AUTO, PARSERS


@dataclass
class ProxyConfig:
    """What one proxy serves and how. The fields are `clawgym serve-proxy`'s options (cli/stages.py,
    `clawgym.fields`; `SERVE_SKIP` are not). The engine, its options, parser and template, and the
    address are also RolloutConfig's fields (the proxy `clawgym rollout` starts is this one), which
    takes their defaults and forms from here."""

    model_dir: Path = option(help="Model directory (HF format; its tokenizer and chat template render prompts).", flag="--model")
    engine: str = option("hf", f"Engine: {' | '.join(ENGINES)} (docs/engines.md).")
    host: str = option("127.0.0.1", "Address to bind; loopback by default.")
    port: int = option(8100, "Port (0 picks a free one); 8100 stays clear of vLLM's (and a judge's) 8000.")
    records_dir: Path = option(Path("records"), "Directory for the per-rollout call records (ROLLOUT.jsonl).", flag="--records")
    admin_token: str | None = option(None, "Admin token (default: a random one, printed).", envvar="CLAWGYM_ADMIN_TOKEN")
    api_key: str | None = option(None, "A shared key any rollout id may use (rollouts register on first call).",
                                 envvar="CLAWGYM_PROXY_API_KEY")
    max_body_bytes: int = option(64 << 20, "The largest request body the proxy reads.")
    ping_interval_s: float = option(5.0, "Seconds between SSE keep-alive pings while the engine generates.", flag="--ping-interval")
    max_context: int | None = option(None, "Override the model's context window in tokens (e.g. the scripted engine serving "
                                           "huge harness prompts).")
    default_max_tokens: int = option(4096, "Tokens a call may sample when it names no limit.")
    tool_parser: str = option(AUTO, f"Tool-call parser: {AUTO} (from the chat template) or one of "
                                                                  f"{', '.join(PARSERS)} (docs/engines.md).")
    chat_template: str | None = option(None, (
        "A Jinja chat template, or a shipped one (chatml-tools, smollm2-tools), replacing the model's own: "
        "for a model whose template does not render tools, tool calls and tool results."), metavar="FILE")
    audit_render: bool = option(False, "Also render every request fully and compare with the incremental result (tests, debugging).")
    engine_options: dict[str, Any] = option(help="The engine's options (docs/engines.md).", factory=dict,
                                            flag="--engine-option", form=KEY_VALUES)
    policy_version: int = option(0, "Policy version of --model, recorded on every call until a sync (a restarted pipeline "
                                    "serves step N's checkpoint as N; a resumed run starts past 0).", minimum=0)


SERVE_SKIP = frozenset({"max_body_bytes", "default_max_tokens", "audit_render"})
"""ProxyConfig fields `clawgym serve-proxy` leaves at their defaults (tests and embedders set them)"""
