"""``hermes_cli.auth`` for plugins: whether a provider is logged in — never a key or a token.

This host keeps every credential to itself (plugins call models through
``ctx.llm``). :func:`get_auth_status` answers from the host's credential store
without returning anything secret; every function that would hand out a token
raises :class:`AuthError` saying so.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from .._home import active_home

__all__ = ["AuthError", "get_auth_status", "get_provider_auth_state", "resolve_spotify_runtime_credentials",
           "resolve_nous_access_token"]


class AuthError(RuntimeError):
    """A credential was asked for; plugins never get one here."""


def _configured_providers() -> set[str]:
    """Provider names with a credential in the home's auth.json, or an environment key (names only)."""
    names: set[str] = set()
    try:
        from auth.authfile import load_auth  # on first use: this shim stays light
        from auth.providers import ENV_VARS  # on first use: this shim stays light

        spec, _ = load_auth(active_home() / "auth.json")
        names |= {str(p).lower() for p in spec.providers}
        import os

        names |= {str(p).lower() for p, envs in dict(ENV_VARS).items()
                  if any(os.environ.get(e) for e in (envs if isinstance(envs, (list, tuple)) else [envs]))}
    except Exception:  # an unreadable store: nobody is logged in (status only, fail closed)
        return names
    return names


def get_auth_status(provider_id: Optional[str] = None) -> Dict[str, Any]:
    """``{"logged_in": bool, "provider": id}`` — status only (no key, token or account data)."""
    target = (provider_id or "").strip().lower()
    if not target:
        return {"logged_in": False}
    return {"logged_in": target in _configured_providers(), "provider": target}


def get_provider_auth_state(provider_id: str) -> Dict[str, Any]:
    return get_auth_status(provider_id)


def _refuse(what: str) -> AuthError:
    return AuthError(f"{what}: plugins never receive credentials in plugin-llm (use ctx.llm for model calls, "
                     "or read your own service's key from the environment)")


def resolve_spotify_runtime_credentials(*args: Any, **kwargs: Any) -> Dict[str, Any]:
    raise _refuse("Spotify credentials")


def resolve_nous_access_token(*args: Any, **kwargs: Any) -> str:
    raise _refuse("Nous access token")
