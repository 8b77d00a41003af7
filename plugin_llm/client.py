"""``GatewayClient``: ``ctx.llm`` for a plugin out of process, over ``plugin-llm serve``.

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
from typing import Any

from plugin_llm import wire
from plugin_llm.errors import (
    PluginLlmConfigError,
    PluginLlmError,
    PluginLlmProviderError,
    PluginLlmTimeoutError,
)
from plugin_llm.types import (
    PluginLlmCompleteResult,
    PluginLlmImageInput,
    PluginLlmStructuredResult,
    PluginLlmTextInput,
    PluginLlmUsage,
)

__all__ = ["GatewayClient", "GatewayStream", "GatewayAsyncStream"]

#: seconds the client waits beyond the call's own timeout (the service's answer must get back)
_MARGIN = 10.0
#: the client's wait when the call names no timeout: the host's default cap on a call is 300 s
_DEFAULT_WAIT = 310.0
_MAX_ERROR_TEXT = 4000
_CHAT = "/v1/chat/completions"


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


def _error(status: int, body: Any) -> BaseException:
    """The in-process exception for an error answer of the service."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return PluginLlmProviderError(f"the gateway answered HTTP {status} without an error body",
                                      status=status, provider="gateway", retryable=status >= 500)
    if error.get("type") == "PluginLlmAuthError" or status == 401:
        message = str(error.get("message") or "")[:_MAX_ERROR_TEXT]
        return PluginLlmConfigError(f"the gateway refused this client's token: {message}")
    if not isinstance(error.get("type"), str) or not error.get("message"):
        return PluginLlmError(f"the gateway answered HTTP {status}")
    return wire.decode_error(error)


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
            try:
                return wire.decode_result(body, structured=structured)
            except wire.WireError as exc:
                raise PluginLlmProviderError(f"the gateway sent a malformed result: {exc}", provider="gateway") from None
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
                          task, options) -> dict[str, Any]:
        return {"messages": messages, **_drop_none(dict(
            provider=provider, model=model, temperature=temperature, max_tokens=max_tokens, timeout=timeout,
            agent_id=agent_id, profile=profile, purpose=purpose, task=task)), **options}

    @staticmethod
    def _structured_payload(instructions, input, json_schema, json_mode, schema_name, system_prompt, provider, model,
                            temperature, max_tokens, timeout, agent_id, profile, purpose, task,
                            options) -> dict[str, Any]:
        blocks = [_block(item) for item in input] if isinstance(input, (list, tuple)) else input
        payload = {"instructions": instructions, "input": blocks, **_drop_none(dict(
            json_schema=json_schema, schema_name=schema_name, system_prompt=system_prompt, provider=provider,
            model=model, temperature=temperature, max_tokens=max_tokens, timeout=timeout, agent_id=agent_id,
            profile=profile, purpose=purpose, task=task)), **options}
        if json_mode:
            payload["json_mode"] = json_mode
        return payload

    # -- the API of PluginLlm
    def complete(self, messages: list[dict[str, Any]], *, provider: str | None = None, model: str | None = None,
                 temperature: float | None = None, max_tokens: int | None = None, timeout: float | None = None,
                 agent_id: str | None = None, profile: str | None = None, purpose: str | None = None,
                 task: str | None = None, **options: Any) -> PluginLlmCompleteResult:
        """Chat completion through the gateway; see :meth:`plugin_llm.PluginLlm.complete`."""
        payload = self._complete_payload(messages, provider, model, temperature, max_tokens, timeout, agent_id,
                                         profile, purpose, task, options)
        return self._post_sync("/v1/plugin-llm/complete", payload, False)

    async def acomplete(self, messages: list[dict[str, Any]], *, provider: str | None = None, model: str | None = None,
                        temperature: float | None = None, max_tokens: int | None = None, timeout: float | None = None,
                        agent_id: str | None = None, profile: str | None = None, purpose: str | None = None,
                        task: str | None = None, **options: Any) -> PluginLlmCompleteResult:
        """Async twin of :meth:`complete`."""
        payload = self._complete_payload(messages, provider, model, temperature, max_tokens, timeout, agent_id,
                                         profile, purpose, task, options)
        return await self._post_async("/v1/plugin-llm/complete", payload, False)

    def complete_structured(self, *, instructions: str, input: str | list[Any], json_schema: dict[str, Any] | None = None,
                            json_mode: bool = False, schema_name: str | None = None, system_prompt: str | None = None,
                            provider: str | None = None, model: str | None = None, temperature: float | None = None,
                            max_tokens: int | None = None, timeout: float | None = None, agent_id: str | None = None,
                            profile: str | None = None, purpose: str | None = None,
                            task: str | None = None, **options: Any) -> PluginLlmStructuredResult:
        """Typed JSON through the gateway; see :meth:`plugin_llm.PluginLlm.complete_structured`."""
        payload = self._structured_payload(instructions, input, json_schema, json_mode, schema_name, system_prompt,
                                           provider, model, temperature, max_tokens, timeout, agent_id, profile,
                                           purpose, task, options)
        return self._post_sync("/v1/plugin-llm/complete_structured", payload, True)

    async def acomplete_structured(self, *, instructions: str, input: str | list[Any],
                                   json_schema: dict[str, Any] | None = None, json_mode: bool = False,
                                   schema_name: str | None = None, system_prompt: str | None = None,
                                   provider: str | None = None, model: str | None = None,
                                   temperature: float | None = None, max_tokens: int | None = None,
                                   timeout: float | None = None, agent_id: str | None = None,
                                   profile: str | None = None, purpose: str | None = None,
                                   task: str | None = None, **options: Any) -> PluginLlmStructuredResult:
        """Async twin of :meth:`complete_structured`."""
        payload = self._structured_payload(instructions, input, json_schema, json_mode, schema_name, system_prompt,
                                           provider, model, temperature, max_tokens, timeout, agent_id, profile,
                                           purpose, task, options)
        return await self._post_async("/v1/plugin-llm/complete_structured", payload, True)

    def stream(self, messages: list[dict[str, Any]], *, provider: str | None = None, model: str | None = None,
               temperature: float | None = None, max_tokens: int | None = None, timeout: float | None = None,
               agent_id: str | None = None, profile: str | None = None, purpose: str | None = None,
               task: str | None = None, **options: Any) -> "GatewayStream":
        """Text deltas through the gateway; see :meth:`plugin_llm.PluginLlm.stream`.

        Sent to ``POST /v1/chat/completions`` with ``stream: true`` (the
        service's OpenAI-compatible SSE): the trust gate, limits and the
        provider's first answer are checked before this returns, and a refusal
        raises here, with the in-process error class and message.
        """
        import httpx

        payload = self._stream_payload(messages, provider, model, temperature, max_tokens, timeout, agent_id,
                                       profile, purpose, task, options)
        if self._sync is None:
            self._sync = httpx.Client(headers=self.__headers, trust_env=False)
        failure: BaseException | None = None
        try:
            request = self._sync.build_request("POST", self._url + _CHAT, json=payload,
                                               timeout=self._wait(payload.get("timeout")))
            response = self._sync.send(request, stream=True)
        except httpx.HTTPError as exc:
            failure = self._transport_error(exc)
        if failure is not None:
            raise failure
        if response.status_code != 200:
            try:
                content = response.read()
            finally:
                response.close()
            self._answer(response.status_code, content, False)
        stream = GatewayStream(response, agent_id)
        stream._prefetch()
        return stream

    def astream(self, messages: list[dict[str, Any]], *, provider: str | None = None, model: str | None = None,
                temperature: float | None = None, max_tokens: int | None = None, timeout: float | None = None,
                agent_id: str | None = None, profile: str | None = None, purpose: str | None = None,
                task: str | None = None, **options: Any) -> "GatewayAsyncStream":
        """Async twin of :meth:`stream` (``async for``, ``async with``, or ``await`` to open it)."""
        payload = self._stream_payload(messages, provider, model, temperature, max_tokens, timeout, agent_id,
                                       profile, purpose, task, options)
        return GatewayAsyncStream(self, payload, agent_id)

    async def _aopen_stream(self, payload: dict[str, Any]) -> Any:
        import httpx

        if self._async is None:
            self._async = httpx.AsyncClient(headers=self.__headers, trust_env=False)
        failure: BaseException | None = None
        try:
            request = self._async.build_request("POST", self._url + _CHAT, json=payload,
                                                timeout=self._wait(payload.get("timeout")))
            response = await self._async.send(request, stream=True)
        except httpx.HTTPError as exc:
            failure = self._transport_error(exc)
        if failure is not None:
            raise failure
        if response.status_code != 200:
            try:
                content = await response.aread()
            finally:
                await response.aclose()
            self._answer(response.status_code, content, False)
        return response

    def _transport_error(self, exc: BaseException) -> PluginLlmError:
        import httpx

        if isinstance(exc, httpx.TimeoutException):
            return PluginLlmTimeoutError(f"the gateway at {self._url} did not answer in time")
        return PluginLlmProviderError(f"the gateway at {self._url} cannot be reached ({type(exc).__name__})",
                                      provider="gateway", retryable=True)

    def _stream_payload(self, messages, provider, model, temperature, max_tokens, timeout, agent_id, profile, purpose,
                        task, options) -> dict[str, Any]:
        payload = self._complete_payload(messages, provider, model, temperature, max_tokens, timeout, agent_id,
                                         profile, purpose, task, options)
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
        return payload

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


class _StreamReader:
    """The gateway's SSE (``chat.completion.chunk`` events) read back into deltas and the final result."""

    def __init__(self, agent_id: str | None) -> None:
        from plugin_llm.transport._stream import SseParser  # on first use: it loads the provider layer

        self._parser = SseParser()
        self._ready: list[str] = []
        self._pieces: list[str] = []
        self._agent_id = agent_id
        self._model = ""
        self._final: dict[str, Any] | None = None
        self.call_id: str | None = None
        self.result: PluginLlmCompleteResult | None = None
        self.done = False

    def feed(self, data: bytes, end: bool = False) -> None:
        import json

        from plugin_llm.transport._stream import SseError  # on first use: it loads the provider layer

        try:
            events = self._parser.end() if end else self._parser.feed(data)
        except SseError as exc:
            raise PluginLlmProviderError(f"the gateway sent a malformed stream: {exc}", provider="gateway") from None
        for _, text in events:
            if text.strip() == "[DONE]":
                self._finish()
                continue
            try:
                doc = json.loads(text)
            except ValueError:
                raise PluginLlmProviderError("the gateway sent an event that is not JSON", provider="gateway") from None
            if not isinstance(doc, dict):
                continue
            if "error" in doc:
                raise _error(_ERROR_STATUS.get(str((doc.get("error") or {}).get("code")), 500), doc)
            if self.call_id is None and isinstance(doc.get("id"), str):
                self.call_id = doc["id"].removeprefix("chatcmpl-")
            if isinstance(doc.get("model"), str):
                self._model = doc["model"]
            if isinstance(doc.get("plugin_llm"), dict):
                self._final = doc["plugin_llm"]
            for choice in doc.get("choices") or ():
                delta = choice.get("delta") if isinstance(choice, dict) else None
                content = delta.get("content") if isinstance(delta, dict) else None
                if isinstance(content, str) and content:
                    self._ready.append(content)
                    self._pieces.append(content)
        if end and not self.done:
            raise PluginLlmProviderError("the gateway's stream ended before its end ([DONE])", provider="gateway")

    def _finish(self) -> None:
        self.done = True
        final = self._final or {}
        self.result = PluginLlmCompleteResult(
            text="".join(self._pieces), provider=str(final.get("provider") or ""), model=self._model,
            agent_id=final.get("agent_id", self._agent_id), usage=wire.decode_usage(final.get("usage")) or PluginLlmUsage(),
            audit=dict(final.get("audit") or {"call_id": self.call_id}))

    def take(self) -> str | None:
        return self._ready.pop(0) if self._ready else None

    @property
    def text(self) -> str:
        return "".join(self._pieces)


#: the HTTP status of an error event's code (the service sends the same body as for a non-streaming answer)
_ERROR_STATUS = {"trust_denied": 403, "quota_exceeded": 429, "schema_mismatch": 422, "timeout": 504,
                 "provider_error": 502, "invalid_request": 400}


class _GatewayStreamBase:
    _reader: _StreamReader

    @property
    def result(self) -> PluginLlmCompleteResult | None:
        """The ``PluginLlmCompleteResult`` once the stream has ended, else None."""
        return self._reader.result

    @property
    def text(self) -> str:
        return self._reader.text

    @property
    def call_id(self) -> str | None:
        return self._reader.call_id

    @property
    def finished(self) -> bool:
        return self._reader.done or self._closed

    _closed = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} call_id={self.call_id} {'finished' if self.finished else 'open'}>"


class GatewayStream(_GatewayStreamBase):
    """:class:`plugin_llm.PluginLlmStream` over the gateway: iterate the deltas; ``close()`` (or leaving a
    ``with`` block) ends it early, which the service records as abandoned."""

    def __init__(self, response: Any, agent_id: str | None) -> None:
        self._response = response
        self._chunks = response.iter_raw()
        self._reader = _StreamReader(agent_id)

    def _pull(self) -> str | None:
        import httpx

        reader = self._reader
        while not reader.done:
            text = reader.take()
            if text is not None:
                return text
            failure: BaseException | None = None
            try:
                data = next(self._chunks, None)
                reader.feed(data or b"", end=data is None)
            except httpx.TimeoutException:
                failure = PluginLlmTimeoutError("the gateway's stream did not go on in time")
            except httpx.HTTPError as exc:
                failure = PluginLlmProviderError(f"the gateway's stream broke ({type(exc).__name__})",
                                                 provider="gateway", retryable=False)
            except BaseException as exc:  # noqa: BLE001 - the error event's exception, raised after closing
                failure = exc
            if failure is not None:
                self.close()
                raise failure
        text = reader.take()
        if reader.done and text is None:
            self.close()
        return text

    def _prefetch(self) -> None:
        self._first = self._pull()

    _first: str | None = None

    def __iter__(self) -> "GatewayStream":
        return self

    def __next__(self) -> str:
        first, self._first = self._first, None
        if first is not None:
            return first
        if self._closed:
            raise StopIteration
        text = self._pull()
        if text is None:
            raise StopIteration
        return text

    def close(self) -> None:
        self._first = None
        if not self._closed:
            self._closed = True
            self._response.close()

    def __enter__(self) -> "GatewayStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class GatewayAsyncStream(_GatewayStreamBase):
    """:class:`plugin_llm.PluginLlmAsyncStream` over the gateway."""

    def __init__(self, client: GatewayClient, payload: dict[str, Any], agent_id: str | None) -> None:
        self._client = client
        self._payload = payload
        self._response: Any = None
        self._chunks: Any = None
        self._first: str | None = None
        self._reader = _StreamReader(agent_id)

    async def _open(self) -> None:
        if self._response is None:
            self._response = await self._client._aopen_stream(self._payload)
            self._chunks = self._response.aiter_raw()
            self._first = await self._pull()

    async def _pull(self) -> str | None:
        import httpx

        reader = self._reader
        while not reader.done:
            text = reader.take()
            if text is not None:
                return text
            failure: BaseException | None = None
            try:
                try:
                    data = await self._chunks.__anext__()
                except StopAsyncIteration:
                    data = None
                reader.feed(data or b"", end=data is None)
            except httpx.TimeoutException:
                failure = PluginLlmTimeoutError("the gateway's stream did not go on in time")
            except httpx.HTTPError as exc:
                failure = PluginLlmProviderError(f"the gateway's stream broke ({type(exc).__name__})",
                                                 provider="gateway", retryable=False)
            except Exception as exc:  # noqa: BLE001 - the error event's exception, raised after closing
                failure = exc
            if failure is not None:
                await self.aclose()
                raise failure
        text = reader.take()
        if reader.done and text is None:
            await self.aclose()
        return text

    def __await__(self):
        return self._opened().__await__()

    async def _opened(self) -> "GatewayAsyncStream":
        await self._open()
        return self

    def __aiter__(self) -> "GatewayAsyncStream":
        return self

    async def __anext__(self) -> str:
        await self._open()
        first, self._first = self._first, None
        if first is not None:
            return first
        if self._closed:
            raise StopAsyncIteration
        text = await self._pull()
        if text is None:
            raise StopAsyncIteration
        return text

    async def aclose(self) -> None:
        self._first = None
        if not self._closed:
            self._closed = True
            if self._response is not None:
                await self._response.aclose()

    async def __aenter__(self) -> "GatewayAsyncStream":
        await self._open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
