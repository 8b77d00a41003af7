"""Test a plugin offline in a few lines: a real host on a temporary home.

::

    from plugin_llm.testing import load_plugin

    def test_summary():
        with load_plugin(Path(__file__).parents[1], replies=["A short summary."]) as plugin:
            assert plugin.run_command("summarize", "a long text") == "A short summary."
            assert plugin.calls()[-1]["plugin_id"] == plugin.key   # the audit line of that call

:func:`load_plugin` loads the plugin with the real :class:`~plugin_llm.plugins.PluginManager`, trust
gate, pipeline and audit log on a throw-away ``HERMES_HOME`` whose ``config.yaml`` uses the embedded
``local`` model (no key, no network); ``replies`` scripts the model's answers. The
:class:`PluginHarness` it yields, its parameters and what is undone on exit: docs/plugin-authors.md.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Union

import yaml

from plugin_llm.host import Session
from plugin_llm.local import model as local_model
from plugin_llm.plugins import PluginManager
from plugin_llm.plugins.context import PluginContext
from plugin_llm.plugins.manifest import find_manifest, load_manifest
from plugin_llm.hardened.safe_yaml import load_yaml

__all__ = ["PluginHarness", "PluginLoadError", "Scripted", "ScriptedReplies", "load_plugin", "provider_error",
           "rate_limited", "stream", "timeout", "tool_call"]


class Scripted:
    """One scripted model turn other than a plain text reply: build it with :func:`stream`,
    :func:`tool_call`, :func:`provider_error`, :func:`rate_limited` or :func:`timeout`."""

    def __init__(self, kind: str, **spec: Any) -> None:
        self.kind = kind
        self.spec = spec

    def __repr__(self) -> str:
        return f"Scripted({self.kind}, {self.spec!r})"

    def turn(self) -> dict[str, Any]:
        """What :mod:`plugin_llm.local.model` answers (a fresh exception for every attempt)."""
        if self.kind == "tool_calls":
            return {"tool_calls": list(self.spec["calls"])}
        error = self.spec.get("error")
        if self.kind == "stream":
            return {"pieces": list(self.spec["chunks"]), "error": None if error is None else error.turn()["error"]}
        if self.kind == "timeout":
            return {"error": TimeoutError(self.spec["message"])}
        return {"error": _http_error(self.spec["status"], self.spec["message"], self.spec.get("retry_after"))}


class _ScriptedHttpError(Exception):
    """A provider's HTTP error as litellm's providers raise it (status, response headers)."""

    def __init__(self, status: int, message: str, headers: dict[str, str]) -> None:
        import httpx

        super().__init__(message)
        self.message = message
        self.status_code = status
        self.headers = headers
        self.response = httpx.Response(status, headers=headers,
                                       request=httpx.Request("POST", "http://local.invalid/v1/chat/completions"))


def _http_error(status: int, message: str, retry_after: float | None) -> _ScriptedHttpError:
    headers = {} if retry_after is None else {"retry-after": f"{retry_after:g}"}
    return _ScriptedHttpError(status, message, headers)


def stream(*chunks: str, error: Scripted | None = None) -> Scripted:
    """A reply streamed as exactly these chunks (``ctx.llm.stream`` yields them one by one; ``complete``
    gets them joined); with ``error`` (a :func:`provider_error`, :func:`rate_limited` or :func:`timeout`)
    the stream fails after the chunks, and a whole-reply call fails with it."""
    if not chunks or not all(isinstance(c, str) for c in chunks):
        raise TypeError("stream(*chunks): give one or more strings")
    if error is not None and (not isinstance(error, Scripted) or error.kind not in ("error", "timeout")):
        raise TypeError("stream(error=...) takes provider_error(...), rate_limited(...) or timeout()")
    return Scripted("stream", chunks=chunks, error=error)


def tool_call(name: str, arguments: Mapping[str, Any] | None = None, *more: tuple[str, Mapping[str, Any]]) -> Scripted:
    """The model calls the tool ``name`` with ``arguments`` (and the ``(name, arguments)`` pairs of
    ``more`` in the same turn): ``result.tool_calls`` of ``complete``, or a tool run in a session."""
    calls = [(name, arguments), *more]
    for tool, args in calls:
        if not isinstance(tool, str) or not tool or (args is not None and not isinstance(args, Mapping)):
            raise TypeError("tool_call(name, arguments): a tool name and a dict of arguments")
    return Scripted("tool_calls", calls=[{"name": t, "arguments": dict(a or {})} for t, a in calls])


def provider_error(status: int = 500, message: str = "scripted provider error", *,
                   retry_after: float | None = None) -> Scripted:
    """The provider answers HTTP ``status``: ``PluginLlmProviderError`` with ``.status``, and ``.retryable``
    as for a real provider (the gateway retries 429, 503, ...: script one failure per attempt, or set
    ``llm: {max_retries: 0}``), ``Retry-After: retry_after`` seconds if given."""
    if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
        raise ValueError(f"provider_error(status=...) must be an HTTP error status (400-599), got {status!r}")
    if retry_after is not None and (isinstance(retry_after, bool) or not isinstance(retry_after, (int, float))
                                    or not 0 <= retry_after <= 3600):
        raise ValueError(f"provider_error(retry_after=...) must be 0-3600 seconds, got {retry_after!r}")
    return Scripted("error", status=status, message=str(message), retry_after=retry_after)


def rate_limited(retry_after: float = 0, message: str = "scripted rate limit") -> Scripted:
    """The provider answers ``429 Too Many Requests`` with ``Retry-After: retry_after`` (retried by
    the gateway after that wait, up to its cap)."""
    return provider_error(429, message, retry_after=retry_after)


def timeout(message: str = "scripted timeout") -> Scripted:
    """The provider does not answer in time: ``PluginLlmTimeoutError`` (at once: nothing waits)."""
    return Scripted("timeout", message=str(message))


Reply = Union[str, Scripted]
Replies = Union[Sequence[Reply], Callable[[list], Union[Reply, None]], None]


class PluginLoadError(RuntimeError):
    """The plugin under test did not load; the message has its error and its frames."""


class ScriptedReplies:
    """What the local model answers while a harness is open (see the module docstring)."""

    def __init__(self, replies: Replies = None) -> None:
        self._lock = threading.Lock()
        self._queue: list[str] = []
        self._fn: Callable[[list], str | None] | None = None
        self.seen: list[list[dict[str, Any]]] = []  #: the messages of every model call, in order
        if callable(replies):
            self._fn = replies
        elif replies is not None:
            self.push(*replies)

    def push(self, *replies: Reply) -> None:
        """Queue more replies (answered in order, one per model call attempt)."""
        for reply in replies:
            _check_reply(reply)
        with self._lock:
            self._queue.extend(replies)

    def __call__(self, messages: list) -> str | dict[str, Any] | None:
        with self._lock:
            self.seen.append([dict(m) for m in messages])
            reply = self._queue.pop(0) if self._queue else None
        if reply is None and self._fn is not None:
            reply = _check_reply(self._fn(messages), allow_none=True)
        return reply.turn() if isinstance(reply, Scripted) else reply


def _check_reply(reply: Any, *, allow_none: bool = False) -> Any:
    if not (isinstance(reply, (str, Scripted)) or (allow_none and reply is None)):
        raise TypeError(f"scripted replies must be strings or plugin_llm.testing.stream/tool_call/provider_error/"
                        f"rate_limited/timeout(...), got {type(reply).__name__}")
    return reply


class PluginHarness:
    """A loaded plugin on a temporary home (see :func:`load_plugin`)."""

    def __init__(self, manager: "PluginManager", key: str, replies: ScriptedReplies) -> None:
        self.manager = manager
        self.key = key
        self.home: Path = manager.home
        self.replies = replies
        self._ctx: "PluginContext | None" = None

    @property
    def ctx(self) -> "PluginContext":
        """A real ``ctx`` of this plugin (same identity, trust block and registries as its own)."""
        if self._ctx is None:
            record = self.manager._records[self.key]
            self._ctx = PluginContext(self.manager, record.candidate.manifest, record.candidate.path,
                                      record.generation)
        return self._ctx

    def info(self) -> dict[str, Any]:
        """This plugin's ``plugins list`` entry (status, tools, hooks, commands, warnings)."""
        return next(p for p in self.manager.list_plugins() if p["key"] == self.key)

    def run_command(self, name: str, args: str = "") -> str | None:
        """Run one of its slash commands as ``plugin-llm run`` would; its exception propagates."""
        return self.manager.run_command(name, args)

    def dispatch_tool(self, name: str, args: Mapping[str, Any] | str | None = None, **kw: Any) -> str:
        """Run a tool call through the host's tool pipeline (guards, the handler, result hooks)."""
        return self.manager.dispatch_tool(name, dict(args) if isinstance(args, Mapping) else args, **kw)

    def invoke_hook(self, name: str, **kwargs: Any) -> list[Any]:
        return list(self.manager.invoke_hook(name, **kwargs) or [])

    def session(self, **kwargs: Any) -> "Session":
        """A host session with this plugin loaded (close it, or use it as a context manager)."""
        return Session(self.manager, **kwargs)

    def events(self) -> list[dict[str, Any]]:
        """Every line of the temporary home's audit log, oldest first."""
        path = self.home / "logs" / "agent.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]

    def calls(self) -> list[dict[str, Any]]:
        """The ``llm.call`` audit records (one per model call the plugin made)."""
        return [e for e in self.events() if e.get("event") == "llm.call"]


def _merged(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` deep-merged into a copy of ``base``: mappings merge, anything else (lists) replaces."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _config(name: str, config: str | Mapping[str, Any] | None, trust: Mapping[str, Any] | None,
            limits: Mapping[str, Any] | None) -> dict[str, Any]:
    """The harness's ``config.yaml`` document: the local model, the plugin enabled, then the author's."""
    doc: dict[str, Any] = {"model": {"provider": "local", "model": "local-echo-1"}, "plugins": {"enabled": [name]}}
    try:
        extra = load_yaml(config) if isinstance(config, str) else config
    except yaml.YAMLError as exc:
        raise PluginLoadError(f"load_plugin(config=...) is not valid YAML: {exc}") from None
    if extra is not None and not isinstance(extra, Mapping):
        raise PluginLoadError(f"load_plugin(config=...) must be a YAML mapping (or a dict), got {type(extra).__name__}")
    doc = _merged(doc, extra or {})
    for section, block in (("llm", trust), ("limits", limits)):
        if block is not None:
            if not isinstance(block, Mapping):
                kwarg = "trust" if section == "llm" else section
                raise PluginLoadError(f"load_plugin({kwarg}=...) must be a dict, got {type(block).__name__}")
            doc = _merged(doc, {"plugins": {"entries": {name: {section: dict(block)}}}})
    plugins = doc.get("plugins") if isinstance(doc.get("plugins"), Mapping) else {}
    enabled, disabled = plugins.get("enabled"), plugins.get("disabled")
    if not isinstance(enabled, list) or name not in enabled:
        raise PluginLoadError(
            f"load_plugin(config=...) sets plugins.enabled to {enabled!r}, without {name!r}: the plugin under test "
            f"would not load. Leave plugins.enabled out (the harness enables {name!r}) or list {name!r} in it.")
    if isinstance(disabled, list) and name in disabled:
        raise PluginLoadError(f"load_plugin(config=...) lists {name!r} in plugins.disabled: the plugin under test "
                              "would not load. Remove it from plugins.disabled.")
    return doc


@contextmanager
def load_plugin(
    plugin_dir: str | os.PathLike[str],
    *,
    replies: Replies = None,
    config: str | Mapping[str, Any] | None = None,
    trust: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    keep_home: bool = False,
) -> Iterator[PluginHarness]:
    """Load the plugin in ``plugin_dir`` on a fresh temporary home; yields a :class:`PluginHarness`.

    ``config`` (YAML text or a dict) is deep-merged into the generated ``config.yaml`` (mappings
    merge, lists replace); ``trust`` and ``limits`` are the plugin's ``plugins.entries.<name>.llm``
    and ``.limits`` blocks.
    """
    source = Path(plugin_dir).expanduser().resolve()
    if not (source / "__init__.py").is_file():
        raise PluginLoadError(f"{source}: not a plugin directory (no __init__.py with register(ctx))")
    found = find_manifest(source)
    name = load_manifest(found).name if found is not None else source.name
    document = _config(name, config, trust, limits)
    scripted = ScriptedReplies(replies)
    home = Path(tempfile.mkdtemp(prefix="plugin-llm-test-"))
    (home / "plugins").mkdir()
    os.symlink(source, home / "plugins" / name)
    (home / "config.yaml").write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    saved = {k: os.environ.get(k) for k in ("HERMES_HOME", *(env or {}))}
    os.environ["HERMES_HOME"] = str(home)
    os.environ.update(env or {})
    local_model._SCRIPT.append(scripted)
    manager = PluginManager(home)
    try:
        manager.discover_plugins()
        entry = next((p for p in manager.list_plugins() if p["name"] == name or p["key"] == name), None)
        if entry is None or entry["status"] != "enabled":
            what = (entry["error"] or entry["status"]) if entry else "not found"
            frames = "".join(f"\n    {f}" for f in (entry or {}).get("error_frames") or ())
            raise PluginLoadError(f"plugin {name} did not load: {what}"
                                  + (f"\n  plugin traceback (most recent call last):{frames}" if frames else ""))
        yield PluginHarness(manager, entry["key"], scripted)
    finally:
        if scripted in local_model._SCRIPT:
            local_model._SCRIPT.remove(scripted)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _close_audit(home)
        if not keep_home:
            shutil.rmtree(home, ignore_errors=True)


def _close_audit(home: Path) -> None:
    import sys

    writer = sys.modules.get("audit.writer")
    if writer is not None and hasattr(writer, "close_all"):
        try:
            writer.close_all()
        except Exception:  # pragma: no cover - closing never fails a test
            pass
