"""The gateway's exception hierarchy.

Every error a plugin can see derives from :class:`PluginLlmError`. Messages are
written for the person who can fix the problem (plugin author or operator) and
never contain a credential.
"""

from __future__ import annotations

__all__ = [
    "PluginLlmError",
    "PluginLlmTrustError",
    "PluginLlmTimeoutError",
    "PluginLlmProviderError",
    "PluginLlmSchemaError",
    "PluginLlmConfigError",
    "PluginLlmQuotaError",
    "PluginLlmLimitError",
]


class PluginLlmError(Exception):
    """Base class of every error raised by ``ctx.llm``."""


class PluginLlmTrustError(PluginLlmError, PermissionError):
    """A plugin asked for an override the operator has not granted.

    Raised before any provider call. ``config_key`` is the exact
    ``plugins.entries.<id>.llm.<key>`` path that would allow it.
    """

    def __init__(self, message: str, *, plugin_id: str = "", config_key: str = "") -> None:
        super().__init__(message)
        self.plugin_id = plugin_id
        self.config_key = config_key


class PluginLlmTimeoutError(PluginLlmError, TimeoutError):
    """The call's total deadline (across retries) expired."""


class PluginLlmProviderError(PluginLlmError):
    """The provider (or the network on the way to it) failed the call."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        provider: str = "",
        retryable: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.provider = provider
        self.retryable = retryable


class PluginLlmSchemaError(PluginLlmError, ValueError):
    """The reply is JSON but does not satisfy the plugin's schema (after repairs).

    ``text`` is the raw reply, ``errors`` the validation errors as
    ``"<json path>: <message>"`` strings, ``usage`` the summed usage.
    """

    def __init__(self, message: str, *, text: str = "", errors: list[str] | None = None, usage=None) -> None:
        super().__init__(message)
        self.text = text
        self.errors = list(errors or [])
        self.usage = usage


class PluginLlmConfigError(PluginLlmError):
    """The host configuration (config.yaml, auth.json, credentials) is unusable."""


class PluginLlmQuotaError(PluginLlmError):
    """A plugin's operator-set budget or rate limit refused the call, before any provider call.

    ``limit`` names it (``budget_usd.day``, ``requests_per_minute``, ...; ``config``, ``price`` or
    ``store`` when the limits themselves cannot be applied), ``config_key`` is the key that sets it,
    ``resets_at`` the Unix time waiting helps until (None when it does not).
    """

    def __init__(self, message: str, *, limit: str | None = None, config_key: str | None = None,
                 resets_at: float | None = None, plugin_id: str | None = None) -> None:
        super().__init__(message)
        self.limit = limit
        self.config_key = config_key
        self.resets_at = resets_at
        self.plugin_id = plugin_id


class PluginLlmLimitError(PluginLlmQuotaError):
    """The in-process form of a limit's refusal: a :class:`PluginLlmQuotaError` carrying the limits
    layer's ``denial`` (what was counted). Across a process or HTTP boundary it is a
    ``PluginLlmQuotaError`` with the same fields."""

    def __init__(self, denial) -> None:  # a limits.Denial (not imported: the limits layer is above)
        super().__init__(denial.message, limit=denial.limit, config_key=denial.config_key,
                         resets_at=denial.resets_at, plugin_id=denial.plugin_id)
        self.denial = denial
