"""Secret redaction: the configs a stage records next to its output never hold credentials."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import orjson

from clawgym.artifacts.files import atomic_write_bytes


SECRET_KEYS = frozenset({"api_key", "admin_token", "token", "hf_token", "access_token", "auth_token", "bearer_token",
                         "secret", "client_secret", "password", "authorization", "wandb_api_key"})
"""the config keys whose values are credentials, by exact name (any case): a key that merely mentions
tokens (max_tokens, token_budget) is a setting and is kept"""


def redact(value: Any) -> Any:
    """A copy with the values of the keys in SECRET_KEYS replaced: configs are shared and committed,
    credentials must never be."""
    if isinstance(value, dict):
        return {k: "<redacted>" if v and str(k).lower() in SECRET_KEYS else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def write_config(path: str | os.PathLike, config: Any) -> Path:
    """Record the resolved config of a stage next to its output (JSON; dataclasses welcome; secrets redacted)."""
    if dataclasses.is_dataclass(config):
        config = dataclasses.asdict(config)
    return atomic_write_bytes(path, orjson.dumps(redact(config), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=str))
