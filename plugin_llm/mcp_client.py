"""The host's MCP client: ``ctx.call_mcp`` calls a tool on a server of config.yaml's ``mcp_servers``.

Hermes's semantics: ``plugins.entries.<id>.mcp_allowlist`` gates each call (absent or not a list:
denied), the timeout is clamped to 1-600 s, the result is an envelope (``{"ok": True, "result"[,
"structuredContent"]}`` / ``{"ok": False, "error"}``) cut at 65,536 characters. Each call is one
connection (a stdio server is a child process for that call only), run on its own thread and event
loop, waited for at most its timeout; each outcome is one ``mcp.call`` audit record and counts under
the plugin's ``requests_per_minute`` / ``max_concurrent``. The ``mcp`` SDK is imported on first call.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import json
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from audit import records
from auth.env_names import auth_file_names, is_credential_name
from auth.redaction import redact_clipped
from plugin_llm import limits
from plugin_llm.errors import PluginLlmQuotaError

__all__ = ["call_mcp", "clamp_timeout", "allowlist_key", "McpServer", "server_spec", "stdio_env", "shutdown",
           "MAX_RESULT_CHARS", "DEFAULT_TIMEOUT", "MIN_TIMEOUT", "MAX_TIMEOUT"]

MAX_RESULT_CHARS = 65_536
DEFAULT_TIMEOUT = 30.0
MIN_TIMEOUT, MAX_TIMEOUT = 1.0, 600.0
MAX_ARGUMENT_BYTES = 1024 * 1024
MAX_IN_FLIGHT = 64  # calls of the whole host at once (each holds a thread, maybe a child process)
_ERROR_CHARS = 2000
#: a server name never holds ':' (the allowlist's ``server:tool`` separator); tool names as MCP allows
_NAMES = {"server": re.compile(r"^[A-Za-z0-9_.-]{1,128}$"), "tool": re.compile(r"^[A-Za-z0-9_./-]{1,128}$")}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

_in_flight = threading.BoundedSemaphore(MAX_IN_FLIGHT)
_threads: set[threading.Thread] = set()
_threads_lock = threading.Lock()


@dataclass(frozen=True)
class McpServer:
    """One entry of ``mcp_servers``: a stdio command or a streamable HTTP ``url``."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold the server's own secret
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


class McpConfigError(ValueError):
    """An ``mcp_servers`` entry this host cannot use (the message names its key)."""


def clamp_timeout(value: Any) -> float:
    """Hermes's rule: seconds clamped to 1-600; anything unparseable is 30."""
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        return DEFAULT_TIMEOUT
    if seconds != seconds:  # NaN
        return DEFAULT_TIMEOUT
    return min(MAX_TIMEOUT, max(MIN_TIMEOUT, seconds))


def allowlist_key(plugin_id: str) -> str:
    return f"plugins.entries.{plugin_id}.mcp_allowlist"


def _check_allowed(raw: Mapping[str, Any], plugin_id: str, server: str, tool: str) -> None:
    """Raise ``PermissionError`` naming the key unless the plugin's ``mcp_allowlist`` (a list of server
    names, or ``server:tool``) allows the call; absent or not a list = deny."""
    key = allowlist_key(plugin_id)
    plugins = raw.get("plugins") if isinstance(raw, Mapping) else None
    entries = plugins.get("entries") if isinstance(plugins, Mapping) else None
    entry = entries.get(plugin_id) if isinstance(entries, Mapping) else None
    allowlist = entry.get("mcp_allowlist") if isinstance(entry, Mapping) else None
    if not isinstance(allowlist, list):
        state = "is not set" if allowlist is None else "is not a list"
        raise PermissionError(f"plugin '{plugin_id}' may not call MCP servers: {key} {state}; the operator "
                              f"allows a server with `{key}: [{server}]` in config.yaml")
    if server in allowlist or f"{server}:{tool}" in allowlist:
        return
    raise PermissionError(f"plugin '{plugin_id}' may not call tool {tool!r} of MCP server {server!r}: neither "
                          f"{server!r} nor {server + ':' + tool!r} is in {key}")


def server_spec(raw: Mapping[str, Any], name: str) -> McpServer:
    """The ``mcp_servers.<name>`` entry, checked (Hermes's format: command/args/env[/cwd] or url/headers)."""
    key = f"mcp_servers.{name}"
    servers = raw.get("mcp_servers") if isinstance(raw, Mapping) else None
    entry = servers.get(name) if isinstance(servers, Mapping) else None
    if not isinstance(entry, Mapping):
        raise McpConfigError(f"MCP server {name!r} is not configured: add {key} (command/args/env, or url) "
                             "to config.yaml")
    if entry.get("enabled") is False:
        raise McpConfigError(f"MCP server {name!r} is disabled ({key}.enabled: false)")
    url, command = entry.get("url"), entry.get("command")
    if (url is None) == (command is None):
        raise McpConfigError(f"{key} needs exactly one of `command` (stdio) or `url` (streamable HTTP)")
    if url is not None:
        if not isinstance(url, str) or not re.match(r"^https?://[^\s]+$", url):
            raise McpConfigError(f"{key}.url must be an http:// or https:// URL")
        return McpServer(name, url=url, headers=_strings(entry.get("headers"), f"{key}.headers"))
    if not isinstance(command, str) or not command.strip():
        raise McpConfigError(f"{key}.command must be a non-empty string")
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"{key}.args must be a list of strings")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise McpConfigError(f"{key}.cwd must be a string")
    return McpServer(name, command=command, args=tuple(args), env=_strings(entry.get("env"), f"{key}.env"), cwd=cwd)


def _strings(value: Any, key: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, (str, int, float))
                                                 and not isinstance(v, bool) for k, v in value.items()):
        raise McpConfigError(f"{key} must be a mapping of names to strings")
    return {k: str(v) for k, v in value.items()}


def stdio_env(spec: McpServer, key_names: frozenset[str] = frozenset(),
              providers: frozenset[str] = frozenset()) -> dict[str, str]:
    """The stdio server's own variables: its configured ``env`` with ``${VAR}`` taken from the host's
    environment, never a variable that may hold a model credential (the SDK adds only HOME, PATH,
    SHELL, TERM, USER, LOGNAME). Raises :class:`McpConfigError` naming the entry otherwise."""
    out: dict[str, str] = {}
    for name, value in spec.env.items():
        where = f"mcp_servers.{spec.name}.env.{name}"
        if is_credential_name(name, key_names=key_names, providers=providers):
            raise McpConfigError(f"{where}: {name} may hold a model provider's credential, which the host never "
                                 "gives an MCP server; rename the variable the server reads")

        def expand(match: re.Match[str]) -> str:
            var = match.group(1)
            if is_credential_name(var, key_names=key_names, providers=providers):
                raise McpConfigError(f"{where}: ${{{var}}} may hold a model provider's credential, which the host "
                                     "never gives an MCP server; write the server's own secret there")
            return os.environ.get(var, "")

        out[name] = _VAR.sub(expand, value)
    return out


# --- one call ---------------------------------------------------------------------------------


def _text_of(block: Any) -> str:
    text = getattr(block, "text", None)
    if isinstance(text, str):
        return text
    dump = block.model_dump(mode="json", exclude_none=True) if hasattr(block, "model_dump") else str(block)
    return json.dumps(dump, ensure_ascii=False, default=str)


def _envelope(result: Any) -> dict[str, Any]:
    """Hermes's envelope of a ``CallToolResult``, every part cut to :data:`MAX_RESULT_CHARS`."""
    text = "\n".join(_text_of(b) for b in (getattr(result, "content", None) or []))
    truncated = len(text) > MAX_RESULT_CHARS
    text = text[:MAX_RESULT_CHARS]
    if getattr(result, "is_error", False):
        out: dict[str, Any] = {"ok": False, "error": text or "the MCP tool reported an error"}
    else:
        out = {"ok": True, "result": text}
        structured = getattr(result, "structured_content", None)
        if structured is not None:
            if len(json.dumps(structured, ensure_ascii=False, default=str)) > MAX_RESULT_CHARS:
                truncated = True
            else:
                out["structuredContent"] = structured
    if truncated:
        out["truncated"] = True
    return out


async def _call(spec: McpServer, env: dict[str, str] | None, tool: str, arguments: dict[str, Any],
                timeout: float, done: concurrent.futures.Future) -> None:
    import anyio
    from mcp import ClientSession

    try:
        with anyio.fail_after(timeout):
            async with _transport(spec, env, timeout) as streams:
                async with ClientSession(streams[0], streams[1], read_timeout_seconds=timeout) as session:
                    await session.initialize()
                    result = await session.call_tool(tool, arguments, read_timeout_seconds=timeout)
                    done.set_result(result)  # before the connection closes (a stdio child may take a while)
    except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
        if not done.done():
            done.set_exception(exc)
        if not isinstance(exc, Exception):
            raise


def _transport(spec: McpServer, env: dict[str, str] | None, timeout: float) -> Any:
    if spec.url is not None:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        client = httpx2.AsyncClient(headers=dict(spec.headers), timeout=httpx2.Timeout(timeout))
        return _owning(client, streamable_http_client(spec.url, http_client=client))
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=spec.command, args=list(spec.args), env=env, cwd=spec.cwd)
    return stdio_client(params, errlog=_devnull())


def _owning(client: Any, inner: Any) -> Any:
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def both() -> Any:
        async with client:
            async with inner as streams:
                yield streams

    return both()


def _devnull() -> Any:
    """Where a stdio server's stderr goes: never the host's terminal or logs (it is the server's output)."""
    return open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the child


def _run(spec: McpServer, env: dict[str, str] | None, tool: str, arguments: dict[str, Any], timeout: float) -> Any:
    """The ``CallToolResult``; raises ``TimeoutError`` at ``timeout`` whatever the server does."""
    import anyio

    done: concurrent.futures.Future = concurrent.futures.Future()

    def main() -> None:
        try:
            anyio.run(_call, spec, env, tool, arguments, timeout, done)
        except BaseException as exc:  # noqa: BLE001 - the caller has (or had) its answer
            if not done.done():
                done.set_exception(exc)
        finally:
            with _threads_lock:
                _threads.discard(threading.current_thread())

    thread = threading.Thread(target=main, name=f"mcp-{spec.name}", daemon=True)
    with _threads_lock:
        _threads.add(thread)
    thread.start()
    try:
        return done.result(timeout=timeout)  # (the thread goes on closing the connection, stopping a child)
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"no answer within {timeout:g}s") from None


def shutdown(timeout: float = 5.0) -> None:
    """Wait (bounded) for calls still closing their connections, so stdio servers are stopped."""
    deadline = time.monotonic() + timeout
    with _threads_lock:
        pending = list(_threads)
    for thread in pending:
        thread.join(max(0.0, deadline - time.monotonic()))


atexit.register(shutdown)


def _failure(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):  # anyio task groups wrap the transport's error
        inner = exc.exceptions[0] if exc.exceptions else exc
        return _failure(inner)
    message = str(exc).strip() or type(exc).__name__
    return redact_clipped(f"{type(exc).__name__}: {message}", _ERROR_CHARS)


def _arguments(arguments: Any) -> tuple[dict[str, Any], str]:
    """The tool's arguments (a JSON object, bounded) and their digest."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise TypeError(f"ctx.call_mcp(): arguments must be a dict, not {type(arguments).__name__}")
    try:
        encoded = records.canonical_json(dict(arguments))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"ctx.call_mcp(): arguments must be JSON (strings, numbers, lists, dicts): {exc}") from None
    if len(encoded) > MAX_ARGUMENT_BYTES:
        raise ValueError(f"ctx.call_mcp(): arguments are {len(encoded)} bytes of JSON, more than {MAX_ARGUMENT_BYTES}")
    import hashlib

    return json.loads(encoded), hashlib.sha256(encoded).hexdigest()


def call_mcp(config: Any, plugin_id: str, server: Any, tool: Any, arguments: Any = None, timeout: Any = DEFAULT_TIMEOUT,
             *, audit_log: Any = None) -> dict[str, Any]:
    """One MCP tool call of ``plugin_id`` under the host's ``config`` (a ``HostConfig``): the envelope, or
    ``PermissionError`` (allowlist) / ``PluginLlmQuotaError`` (limits). Exactly one audit record."""
    from plugin_llm.auditing import host_audit_log  # on first use: it loads PyYAML

    started = time.monotonic()
    for what, value in (("server", server), ("tool", tool)):
        if not isinstance(value, str) or not _NAMES[what].match(value):
            raise ValueError(f"ctx.call_mcp(): {what} must be a name of 1-128 letters, digits, '_', '.' or '-'"
                             + (" or '/'" if what == "tool" else ""))
    seconds = clamp_timeout(timeout)
    sink = audit_log if audit_log is not None else host_audit_log(config.home, config.audit)

    def record(status: str, **fields: Any) -> None:
        sink.write_event(records.EVENT_MCP_CALL, **records.mcp_record(
            plugin_id=plugin_id, server=server, tool=tool, status=status, arguments_sha256=digest,
            duration_ms=(time.monotonic() - started) * 1000, **fields))

    bad: Exception | None = None
    try:
        payload, digest = _arguments(arguments)
    except (TypeError, ValueError) as exc:
        payload, digest, bad = {}, records.sha256_text(f"unusable {type(arguments).__name__}"), exc
    try:
        _check_allowed(config.raw, plugin_id, server, tool)
    except PermissionError as exc:
        record("denied", error_type="PermissionError", error_message=str(exc), decision_key=allowlist_key(plugin_id))
        raise
    if bad is not None:
        record("error", error_type=type(bad).__name__, error_message=str(bad))
        raise bad
    try:
        spec = server_spec(config.raw, server)
        env = stdio_env(spec, *_auth_names(config.home)) if spec.command is not None else None
    except McpConfigError as exc:
        record("error", error_type="McpConfigError", error_message=str(exc))
        return {"ok": False, "error": str(exc)}
    try:
        ticket = limits.admit_request(config.limits, config.home, plugin_id, deadline=time.monotonic() + seconds)
    except PluginLlmQuotaError as exc:
        extra: dict[str, Any] = {records.LIMITS_LIMIT: exc.limit}
        if exc.resets_at is not None:
            extra[records.LIMITS_RESETS_AT] = exc.resets_at
        record("quota", error_type=type(exc).__name__, error_message=str(exc), decision_key=exc.config_key,
               extra=extra)
        raise
    settings = getattr(sink, "settings", None)
    if getattr(settings, "required", False):
        try:  # audit.required: nothing reaches the server unless its record can be written
            sink.check_writable()
        except Exception as exc:
            ticket.release()
            record("error", error_type=type(exc).__name__, error_message=str(exc))
            raise
    if not _in_flight.acquire(blocking=False):
        ticket.release()
        message = f"the host already runs {MAX_IN_FLIGHT} MCP calls; try again shortly"
        record("error", error_type="Busy", error_message=message)
        return {"ok": False, "error": message}
    try:
        result = _run(spec, env, tool, payload, seconds)
    except TimeoutError:
        message = f"MCP server {server!r} did not answer tool {tool!r} within {seconds:g}s"
        record("timeout", error_type="TimeoutError", error_message=message)
        return {"ok": False, "error": message}
    except Exception as exc:  # noqa: BLE001 - the server (or the way to it) failed: the envelope says so
        message = f"MCP call {server}/{tool} failed: {_failure(exc)}"
        record("error", error_type=type(exc).__name__, error_message=message)
        return {"ok": False, "error": message}
    finally:
        _in_flight.release()
        ticket.release()
    envelope = _envelope(result)
    result_digest = records.sha256_json(envelope)
    if envelope["ok"]:
        record("ok", result_sha256=result_digest, truncated=bool(envelope.get("truncated")))
    else:
        record("error", result_sha256=result_digest, truncated=bool(envelope.get("truncated")),
               error_type="ToolError")
    return envelope


def _auth_names(home: Any) -> tuple[frozenset[str], frozenset[str]]:
    try:
        return auth_file_names(home)
    except Exception:  # noqa: BLE001 - an unusable auth.json adds no names
        return frozenset(), frozenset()
