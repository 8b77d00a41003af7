"""Test a plugin offline in a few lines: a real host on a temporary home.

::

    from pathlib import Path
    from plugin_llm.testing import load_plugin

    def test_summary():
        with load_plugin(Path(__file__).parents[1], replies=["A short summary."]) as plugin:
            assert plugin.run_command("summarize", "a long text") == "A short summary."
            assert plugin.calls()[-1]["plugin_id"] == plugin.key   # the audit line of that call

:func:`load_plugin` builds a throw-away ``HERMES_HOME`` (``config.yaml`` on the
embedded ``local`` model: no key, no network), links the plugin directory into
its ``plugins/`` (your edits apply on the next :func:`load_plugin`), enables it
and loads it with the real :class:`~plugin_llm.plugins.PluginManager`: the same
import, ``register(ctx)``, trust gate, pipeline and audit log as production.
A plugin that fails to load raises :class:`PluginLoadError` with its error and
the plugin's own frames (file:line).

``replies`` scripts what the local model answers: a list of strings (one per
model call, in order; once used up the local model's own rules answer again),
or a function ``replies(messages) -> str | None`` (``None``: the rules answer).
Without ``replies`` the local model answers deterministically (see
:mod:`plugin_llm.local_model`: it echoes, summarises, fills JSON schemas and
calls offered tools when asked "call <tool>").

The :class:`PluginHarness` it yields has:

* ``ctx`` — a real :class:`~plugin_llm.plugins.context.PluginContext` of the plugin
  (``ctx.llm.complete(...)`` goes through the trust gate as the plugin);
* ``run_command(name, args)``, ``dispatch_tool(name, args)``, ``invoke_hook(name, **kw)``;
* ``session()`` — a host :class:`~plugin_llm.host.Session` (``run_turn``: the model may call the
  plugin's tools);
* ``calls()`` — the ``llm.call`` audit records, ``events()`` every audit line;
* ``home`` (the temporary home), ``key``, ``manager``, ``info()`` (its ``plugins list`` entry).

``config`` (YAML text or a dict) is deep-merged into ``config.yaml`` (lists replace);
``trust=`` / ``limits=`` set the plugin's trust and limits blocks; ``env`` sets environment variables while the harness
is open (``requires_env``). Everything is undone on exit (environment, scripted
replies, the temporary home unless ``keep_home=True``).
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
from typing import TYPE_CHECKING, Any, Union

import yaml

if TYPE_CHECKING:  # pragma: no cover
    from plugin_llm.host import Session
    from plugin_llm.plugins import PluginManager
    from plugin_llm.plugins.context import PluginContext

__all__ = ["PluginHarness", "PluginLoadError", "ScriptedReplies", "load_plugin"]

Replies = Union[Sequence[str], Callable[[list], Union[str, None]], None]


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

    def push(self, *texts: str) -> None:
        """Queue more replies (answered in order, one per model call)."""
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"scripted replies must be strings, got {type(text).__name__}")
        with self._lock:
            self._queue.extend(texts)

    def __call__(self, messages: list) -> str | None:
        with self._lock:
            self.seen.append([dict(m) for m in messages])
            if self._queue:
                return self._queue.pop(0)
        return self._fn(messages) if self._fn is not None else None


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
            from plugin_llm.plugins.context import PluginContext

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
        from plugin_llm.host import Session

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
    from plugin_llm.safe_yaml import load_yaml

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
    from plugin_llm import local_model
    from plugin_llm.plugins import PluginManager
    from plugin_llm.plugins.manifest import find_manifest, load_manifest

    source = Path(plugin_dir).expanduser().resolve()
    if not (source / "__init__.py").is_file():
        raise PluginLoadError(f"{source}: not a plugin directory (no __init__.py with register(ctx))")
    found = find_manifest(source)
    name = load_manifest(found).name if found is not None else source.name
    document = _config(name, config, trust, limits)
    home = Path(tempfile.mkdtemp(prefix="plugin-llm-test-"))
    (home / "plugins").mkdir()
    os.symlink(source, home / "plugins" / name)
    (home / "config.yaml").write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    scripted = ScriptedReplies(replies)
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
