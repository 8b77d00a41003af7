"""``tools.xai_http``: helpers of the xAI backends.

No credential is handed out: ``XAI_API_KEY`` is the variable this host reads
its own xAI provider key from, and plugins never receive the host's keys
(their model calls go through ``ctx.llm``). :func:`has_xai_credentials` is
therefore False and :func:`resolve_xai_http_credentials` returns an empty
``api_key``: an xAI backend loads and reports itself unavailable.
"""

from __future__ import annotations

import datetime
import os
import uuid
from typing import Any, Dict, Optional

from .._home import active_home

__all__ = ["has_xai_credentials", "hermes_xai_user_agent", "read_xai_imagine_storage_config",
           "build_xai_storage_options", "xai_storage_notice_text", "maybe_mark_xai_storage_notice_seen",
           "resolve_xai_http_credentials", "get_env_value"]

DEFAULT_XAI_BASE_URL = "https://api.x.ai/v1"
MAX_XAI_STORAGE_EXPIRES_AFTER_SECONDS = 30 * 24 * 60 * 60


def get_env_value(name: str, default: Any = None) -> Any:
    """The variable, or ``default`` when unset or one that may hold a credential of this host."""
    from ..hermes_cli.config import plugin_may_read  # on first use: this shim stays light

    value = os.environ.get(name) if plugin_may_read(str(name)) else None
    return value if value not in (None, "") else default


def has_xai_credentials() -> bool:
    return False  # the host's XAI_API_KEY is never a plugin's


def hermes_xai_user_agent() -> str:
    from ..hermes_cli import __version__  # on first use: this shim stays light

    return f"Hermes-Agent/{__version__}"


def resolve_xai_http_credentials(*, force_refresh: bool = False, api_key_hint: str = "") -> Dict[str, str]:
    """``{"provider", "api_key", "base_url"}`` with an empty ``api_key`` (see the module docstring)."""
    base = str(get_env_value("HERMES_XAI_BASE_URL") or get_env_value("XAI_BASE_URL") or DEFAULT_XAI_BASE_URL)
    return {"provider": "xai", "api_key": "", "base_url": base.rstrip("/")}


def _section(name: str) -> Dict[str, Any]:
    from ..hermes_cli.config import load_config  # on first use: this shim stays light

    value = load_config().get(name)
    return value if isinstance(value, dict) else {}


def _bool(value: Any, default: bool) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip():
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return default


def _expires(value: Any) -> Optional[int]:
    if value is None or isinstance(value, bool):
        return None
    try:
        seconds = int(value)
    except (TypeError, ValueError):
        return None
    return max(1, min(seconds, MAX_XAI_STORAGE_EXPIRES_AFTER_SECONDS))


def read_xai_imagine_storage_config(section_name: str) -> Dict[str, Any]:
    xai = _section(section_name).get("xai")
    storage = xai.get("storage") if isinstance(xai, dict) else None
    storage = storage if isinstance(storage, dict) else {}
    return {"enabled": _bool(storage.get("enabled"), True), "public_url": _bool(storage.get("public_url"), True),
            "expires_after": _expires(storage.get("expires_after"))}


def build_xai_storage_options(section_name: str, *, filename_prefix: str, extension: str) -> Optional[Dict[str, Any]]:
    cfg = read_xai_imagine_storage_config(section_name)
    if not cfg["enabled"]:
        return None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    payload: Dict[str, Any] = {"filename": f"{filename_prefix}-{stamp}-{uuid.uuid4().hex[:8]}.{extension.lstrip('.') or 'bin'}",
                               "public_url": bool(cfg["public_url"])}
    if cfg["expires_after"] is not None:
        payload["expires_after"] = cfg["expires_after"]
    return payload


def xai_storage_notice_text(section_name: str) -> str:
    cfg = read_xai_imagine_storage_config(section_name)
    if not cfg["enabled"]:
        return ""
    retention = ("without an automatic expiry" if cfg["expires_after"] is None
                 else f"for about {cfg['expires_after'] / 86400:g} day(s)")
    return (f"xAI Imagine storage is enabled so generated media gets a reusable public URL {retention}. "
            f"Disable this with `{section_name}.xai.storage.enabled: false`.")


def maybe_mark_xai_storage_notice_seen(section_name: str) -> Optional[str]:
    notice = xai_storage_notice_text(section_name)
    if not notice:
        return None
    try:
        marker = active_home() / "state" / f"{section_name}_xai_storage_notice_seen"
        if marker.exists():
            return None
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(datetime.datetime.now(datetime.timezone.utc).isoformat() + "\n")
    except OSError:
        pass
    return notice
