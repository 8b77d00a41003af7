"""Test helper: the gateway service on real uvicorn, 127.0.0.1, a free port, in a thread of the test.

    with ServiceServer(home) as service:
        token = service.token("my-plugin")
        httpx.post(service.url + "/v1/plugin-llm/complete", headers=service.auth(token), json={...})
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from plugin_llm.service.app import create_app
from plugin_llm.service.tokens import TokenStore

__all__ = ["ServiceServer"]


class ServiceServer:
    def __init__(self, home: Path, *, http: Any = "auto", connections: Any = None, **app_kwargs: Any) -> None:
        """``http``: uvicorn's protocol (e.g. ``plugin_llm.service.connections.PROTOCOL``, what ``serve`` runs);
        ``connections``: its ``ConnectionLimits``."""
        self.home = Path(home)
        self.app = create_app(self.home, **app_kwargs)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", access_log=False, http=http)
        if connections is not None:
            config.plugin_llm_connections = connections
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def token(self, plugin: str, **kw: Any) -> str:
        store = TokenStore(self.home)
        try:
            return store.create(plugin, **kw)[1]
        finally:
            store.close()

    @staticmethod
    def auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def start(self) -> "ServiceServer":
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True,
                                        name=f"service:{self.port}")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the service did not start")
            time.sleep(0.01)
        from plugin_llm.transport._loading import load_litellm

        load_litellm()  # the service warms up in the background; tests want it ready (httpx's 5 s timeout)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._sock.close()

    def __enter__(self) -> "ServiceServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
