"""Run a test module's tests on both transport paths: the fast path and the litellm.completion fallback.

``from tests.paths import transport_path`` in a test module makes every test
in it run twice (``[fast]``, ``[fallback]``): the fallback by
``PLUGIN_LLM_FAST_PATH=0``. After each test, every provider attempt must have
gone through the path under test (the in-process ``local`` model always takes
the fallback). A test that only makes sense on some paths parametrizes
``transport_path`` itself (``indirect=True``).
"""

from __future__ import annotations

import pytest

__all__ = ["transport_path", "PATHS"]

PATHS = ["fast", "fallback"]


@pytest.fixture(params=PATHS, autouse=True)
def transport_path(request, monkeypatch) -> str:
    from plugin_llm.transport import _fallback, _fastpath

    path = request.param
    if path == "fallback":
        monkeypatch.setenv(_fastpath.FAST_PATH_ENV, "0")
    else:
        monkeypatch.delenv(_fastpath.FAST_PATH_ENV, raising=False)
    taken: list[tuple[str, str]] = []
    for module, name in ((_fastpath, "fast"), (_fallback, "fallback")):
        for fn in ("send", "asend"):
            def wrapped(*args, _original=getattr(module, fn), _name=name):
                request_ = args[1]  # (fast route | litellm, request, key[, attempt])
                taken.append((_name, request_.route.provider))
                return _original(*args)
            monkeypatch.setattr(module, fn, wrapped)
    yield path
    wrong = [(p, provider) for p, provider in taken if p != path and provider != "local"]
    assert not wrong, f"attempts on the other path than {path}: {wrong}"
