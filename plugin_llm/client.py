"""``GatewayClient``: ``ctx.llm`` for a plugin out of process, over ``plugin-llm serve`` (issue 14).

The same ``complete``/``complete_structured`` signatures (and async twins) as
:class:`plugin_llm.PluginLlm`, the same result dataclasses and the same error
classes with the same messages, so moving a plugin out of process changes one
line::

    llm = PluginLlm(plugin_id="my-plugin")                            # in the host
    llm = GatewayClient("http://127.0.0.1:8787", os.environ["PLUGIN_LLM_TOKEN"])  # anywhere else

The token names the plugin; the service decides everything else (route,
trust, limits, audit). A refused token raises ``PluginLlmConfigError``; the
gateway being unreachable raises ``PluginLlmProviderError`` (``provider`` is
``"gateway"``, retryable). Image ``data`` bytes travel base64-encoded. The
client never puts the token in a message, a repr or an exception.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

from plugin_llm.errors import (
    PluginLlmConfigError,
    PluginLlmError,
    PluginLlmProviderError,
    PluginLlmQuotaError,
    PluginLlmSchemaError,
    PluginLlmTimeoutError,
    PluginLlmTrustError,
)
from plugin_llm.types import (
    PluginLlmCompleteResult,
    PluginLlmImageInput,
    PluginLlmStructuredResult,
    PluginLlmTextInput,
    PluginLlmToolCall,
    PluginLlmUsage,
)

__all__ = ["GatewayClient"]

#: seconds the client waits beyond the call's own timeout (the service's answer must get back)
_MARGIN = 10.0
#: the client's wait when the call names no timeout: the host's default cap on a call is 300 s
_DEFAULT_WAIT = 310.0
_MAX_ERROR_TEXT = 4000


def _drop_none(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _block(item: Any) -> Any:
    """An input block as JSON (image bytes as base64 text)."""
    if isinstance(item, PluginLlmTextInput):
        return {"type": "text", "text": item.text}
    if isinstance(item, PluginLlmImageInput):
        block: dict[str, Any] = {"type": "image", "mime_type": item.mime_type, "file_name": item.file_name}
        if item.data is not None:
            block["data"] = base64.b64encode(item.data).decode("ascii")
        else:
            block["url"] = item.url
        return block
    if isinstance(item, dict) and isinstance(item.get("data"), (bytes, bytearray)):
        return {**item, "data": base64.b64encode(bytes(item["data"])).decode("ascii")}
    return item


def _usage(data: Any) -> PluginLlmUsage:
    if not isinstance(data, dict):
        return PluginLlmUsage()
    fields = {f.name for f in dataclasses.fields(PluginLlmUsage)}
    return PluginLlmUsage(**{k: v for k, v in data.items() if k in fields})


def _result(data: dict[str, Any], structured: bool) -> PluginLlmCompleteResult:
    calls = tuple(PluginLlmToolCall(c["id"], c["name"], c.get("arguments") or {}, c.get("raw_arguments") or "{}")
                  for c in data.get("tool_calls") or ())
    common = dict(text=data.get("text") or "", provider=data.get("provider") or "", model=data.get("model") or "",
                  agent_id=data.get("agent_id"), usage=_usage(data.get("usage")), audit=dict(data.get("audit") or {}),
                  tool_calls=calls)
    if structured:
        return PluginLlmStructuredResult(**common, parsed=data.get("parsed"),
                                         content_type=data.get("content_type") or "text")
    return PluginLlmCompleteResult(**common)


def _error(status: int, body: Any) -> BaseException:
    """The in-process exception for an error answer of the service."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return PluginLlmProviderError(f"the gateway answered HTTP {status} without an error body",
                                      status=status, provider="gateway", retryable=status >= 500)
    kind = error.get("type")
    message = str(error.get("message") or "")[:_MAX_ERROR_TEXT]
    if kind == "PluginLlmTrustError":
        return PluginLlmTrustError(message, plugin_id="", config_key=error.get("config_key") or "")
    if kind == "PluginLlmQuotaError":
        exc = PluginLlmQuotaError(message)
        exc.limit = error.get("limit")  # type: ignore[attr-defined]
        exc.config_key = error.get("config_key")  # type: ignore[attr-defined]
        exc.resets_at = error.get("resets_at")  # type: ignore[attr-defined]
        return exc
    if kind == "PluginLlmSchemaError":
        usage = error.get("usage")
        return PluginLlmSchemaError(message, text=error.get("text") or "", errors=list(error.get("errors") or ()),
                                    usage=_usage(usage) if isinstance(usage, dict) else None)
    if kind == "PluginLlmTimeoutError":
        return PluginLlmTimeoutError(message)
    if kind == "PluginLlmProviderError":
        return PluginLlmProviderError(message, status=error.get("status"), provider=error.get("provider") or "",
                                      retryable=bool(error.get("retryable")))
    if kind == "PluginLlmConfigError":
        return PluginLlmConfigError(message)
    if kind == "ValueError":
        return ValueError(message)
    if kind == "TypeError":
        return TypeError(message)
    if kind == "PluginLlmAuthError" or status == 401:
        return PluginLlmConfigError(f"the gateway refused this client's token: {message}")
    return PluginLlmError(message or f"the gateway answered HTTP {status}")


class GatewayClient:
    """``PluginLlm``'s API over HTTP, as the plugin the token names.

    ``url`` is the service's base URL (``http://127.0.0.1:8787``); ``timeout``
    caps how long the client waits for any one answer (default: the call's own
    ``timeout=`` plus a margin, else 310 s). One connection pool per client;
    close it with :meth:`close` / :meth:`aclose` or use it as a context manager.
    """

    def __init__(self, url: str, token: str, *, timeout: float | None = None) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError("url must be the gateway's http:// or https:// base URL, such as http://127.0.0.1:8787")
        if not isinstance(token, str) or not token.startswith("plg_"):
            raise ValueError("token must be a plugin token (plg_...) created with 'plugin-llm tokens create PLUGIN'")
        self._url = url.rstrip("/")
        self.__headers = {"Authorization": f"Bearer {token}"}
        self._timeout = timeout
        self._sync: Any = None
        self._async: Any = None

    def __repr__(self) -> str:
        return f"GatewayClient({self._url!r})"

    # -- plumbing
    def _wait(self, timeout: Any) -> float:
        if self._timeout is not None:
            return self._timeout
        if type(timeout) in (int, float) and 0 < timeout < 1e6:
            return float(timeout) + _MARGIN
        return _DEFAULT_WAIT

    @staticmethod
    def _answer(status: int, content: bytes, structured: bool) -> Any:
        import json

        try:
            body = json.loads(content) if content else None
        except ValueError:
            body = None
        if status == 200 and isinstance(body, dict):
            return _result(body, structured)
        error = _error(status, body)
        raise error

    def _post_sync(self, path: str, payload: dict[str, Any], structured: bool) -> Any:
        import httpx

        if self._sync is None:
            self._sync = httpx.Client(headers=self.__headers, trust_env=False)
        failure: BaseException | None = None
        try:
            response = self._sync.post(self._url + path, json=payload, timeout=self._wait(payload.get("timeout")))
        except httpx.TimeoutException:
            failure = PluginLlmTimeoutError(f"the gateway at {self._url} did not answer in time")
        except httpx.HTTPError as exc:
            failure = PluginLlmProviderError(f"the gateway at {self._url} cannot be reached ({type(exc).__name__})",
                                             provider="gateway", retryable=True)
        if failure is not None:
            raise failure
        return self._answer(response.status_code, response.content, structured)

    async def _post_async(self, path: str, payload: dict[str, Any], structured: bool) -> Any:
        import httpx

        if self._async is None:
            self._async = httpx.AsyncClient(headers=self.__headers, trust_env=False)
        failure: BaseException | None = None
        try:
            response = await self._async.post(self._url + path, json=payload, timeout=self._wait(payload.get("timeout")))
        except httpx.TimeoutException:
            failure = PluginLlmTimeoutError(f"the gateway at {self._url} did not answer in time")
        except httpx.HTTPError as exc:
            failure = PluginLlmProviderError(f"the gateway at {self._url} cannot be reached ({type(exc).__name__})",
                                             provider="gateway", retryable=True)
        if failure is not None:
            raise failure
        return self._answer(response.status_code, response.content, structured)

    @staticmethod
    def _complete_payload(messages, provider, model, temperature, max_tokens, timeout, agent_id, profile, purpose,
                          options) -> dict[str, Any]:
        return {"messages": messages, **_drop_none(dict(
            provider=provider, model=model, temperature=temperature, max_tokens=max_tokens, timeout=timeout,
            agent_id=agent_id, profile=profile, purpose=purpose)), **options}

    @staticmethod
    def _structured_payload(instructions, input, json_schema, json_mode, schema_name, system_prompt, provider, model,
                            temperature, max_tokens, timeout, agent_id, profile, purpose, options) -> dict[str, Any]:
        blocks = [_block(item) for item in input] if isinstance(input, (list, tuple)) else input
        payload = {"instructions": instructions, "input": blocks, **_drop_none(dict(
            json_schema=json_schema, schema_name=schema_name, system_prompt=system_prompt, provider=provider,
            model=model, temperature=temperature, max_tokens=max_tokens, timeout=timeout, agent_id=agent_id,
            profile=profile, purpose=purpose)), **options}
        if json_mode:
            payload["json_mode"] = json_mode
        return payload

    # -- the API of PluginLlm
    def complete(self, messages: list[dict[str, Any]], *, provider: str | None = None, model: str | None = None,
                 temperature: float | None = None, max_tokens: int | None = None, timeout: float | None = None,
                 agent_id: str | None = None, profile: str | None = None, purpose: str | None = None,
                 **options: Any) -> PluginLlmCompleteResult:
        """Chat completion through the gateway; see :meth:`plugin_llm.PluginLlm.complete`."""
        payload = self._complete_payload(messages, provider, model, temperature, max_tokens, timeout, agent_id,
                                         profile, purpose, options)
        return self._post_sync("/v1/plugin-llm/complete", payload, False)

    async def acomplete(self, messages: list[dict[str, Any]], *, provider: str | None = None, model: str | None = None,
                        temperature: float | None = None, max_tokens: int | None = None, timeout: float | None = None,
                        agent_id: str | None = None, profile: str | None = None, purpose: str | None = None,
                        **options: Any) -> PluginLlmCompleteResult:
        """Async twin of :meth:`complete`."""
        payload = self._complete_payload(messages, provider, model, temperature, max_tokens, timeout, agent_id,
                                         profile, purpose, options)
        return await self._post_async("/v1/plugin-llm/complete", payload, False)

    def complete_structured(self, *, instructions: str, input: list[Any], json_schema: dict[str, Any] | None = None,
                            json_mode: bool = False, schema_name: str | None = None, system_prompt: str | None = None,
                            provider: str | None = None, model: str | None = None, temperature: float | None = None,
                            max_tokens: int | None = None, timeout: float | None = None, agent_id: str | None = None,
                            profile: str | None = None, purpose: str | None = None,
                            **options: Any) -> PluginLlmStructuredResult:
        """Typed JSON through the gateway; see :meth:`plugin_llm.PluginLlm.complete_structured`."""
        payload = self._structured_payload(instructions, input, json_schema, json_mode, schema_name, system_prompt,
                                           provider, model, temperature, max_tokens, timeout, agent_id, profile,
                                           purpose, options)
        return self._post_sync("/v1/plugin-llm/complete_structured", payload, True)

    async def acomplete_structured(self, *, instructions: str, input: list[Any],
                                   json_schema: dict[str, Any] | None = None, json_mode: bool = False,
                                   schema_name: str | None = None, system_prompt: str | None = None,
                                   provider: str | None = None, model: str | None = None,
                                   temperature: float | None = None, max_tokens: int | None = None,
                                   timeout: float | None = None, agent_id: str | None = None,
                                   profile: str | None = None, purpose: str | None = None,
                                   **options: Any) -> PluginLlmStructuredResult:
        """Async twin of :meth:`complete_structured`."""
        payload = self._structured_payload(instructions, input, json_schema, json_mode, schema_name, system_prompt,
                                           provider, model, temperature, max_tokens, timeout, agent_id, profile,
                                           purpose, options)
        return await self._post_async("/v1/plugin-llm/complete_structured", payload, True)

    # -- lifecycle
    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None
        self.close()

    def __enter__(self) -> "GatewayClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "GatewayClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
