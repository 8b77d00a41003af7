"""``agent.image_gen_provider``: the base class of an image generation backend and its helpers.

A backend registers an instance with ``ctx.register_image_gen_provider``; the
active one is the one ``image_gen.provider`` names (its ``name``, or the
plugin's key/directory name). Providers return the dicts built by
:func:`success_response` / :func:`error_response`. Images are cached under
``<home>/cache/images/``.
"""

from __future__ import annotations

import abc
import base64
import datetime
import logging
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .._home import active_home

__all__ = [
    "VALID_ASPECT_RATIOS",
    "DEFAULT_ASPECT_RATIO",
    "ImageGenProvider",
    "resolve_aspect_ratio",
    "normalize_reference_images",
    "save_b64_image",
    "save_url_image",
    "success_response",
    "error_response",
]

logger = logging.getLogger(__name__)

VALID_ASPECT_RATIOS: Tuple[str, ...] = ("landscape", "square", "portrait")
DEFAULT_ASPECT_RATIO = "landscape"


class ImageGenProvider(abc.ABC):
    """Base class of an image generation backend: implement ``name`` and ``generate``."""

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """Stable short identifier used in ``image_gen.provider``."""

    @property
    def display_name(self) -> str:
        return self.name.title()

    def is_available(self) -> bool:
        return True

    def list_models(self) -> List[Dict[str, Any]]:
        return []

    def get_setup_schema(self) -> Dict[str, Any]:
        return {"name": self.display_name, "badge": "", "tag": "", "env_vars": []}

    def default_model(self) -> Optional[str]:
        models = self.list_models()
        return models[0].get("id") if models else None

    def capabilities(self) -> Dict[str, Any]:
        return {"modalities": ["text"], "max_reference_images": 0}

    @abc.abstractmethod
    def generate(self, prompt: str, aspect_ratio: str = DEFAULT_ASPECT_RATIO, *, image_url: Optional[str] = None,
                 reference_image_urls: Optional[List[str]] = None, **kwargs: Any) -> Dict[str, Any]:
        """Generate (or, with ``image_url``, edit) an image; unknown keywords must be ignored."""


def resolve_aspect_ratio(value: Optional[str]) -> str:
    """``value`` if it is a valid aspect ratio (case-insensitive), else ``landscape``."""
    if not isinstance(value, str):
        return DEFAULT_ASPECT_RATIO
    v = value.strip().lower()
    return v if v in VALID_ASPECT_RATIOS else DEFAULT_ASPECT_RATIO


def normalize_reference_images(value: Any) -> Optional[List[str]]:
    """A clean list of non-blank URL/path strings (None when nothing usable)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        return None
    out = [item.strip() for item in value if isinstance(item, str) and item.strip()]
    return out or None


def _images_cache_dir() -> Path:
    path = active_home() / "cache" / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _cache_path(prefix: str, extension: str) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S")
    return _images_cache_dir() / f"{prefix}_{stamp}_{uuid.uuid4().hex[:8]}.{extension}"


def save_b64_image(b64_data: str, *, prefix: str = "image", extension: str = "png") -> Path:
    """Decode base64 image data into ``<home>/cache/images/`` and return the file's path."""
    path = _cache_path(prefix, extension)
    path.write_bytes(base64.b64decode(b64_data))
    return path


_CONTENT_TYPES = {"image/png": "png", "image/jpeg": "jpg", "image/jpg": "jpg", "image/webp": "webp",
                  "image/gif": "gif"}


def save_url_image(url: str, *, prefix: str = "image", timeout: float = 60.0,
                   max_bytes: int = 25 * 1024 * 1024) -> Path:
    """Download an image URL into ``<home>/cache/images/`` (at most ``max_bytes``); raises on failure."""
    import httpx

    with httpx.stream("GET", url, timeout=timeout, follow_redirects=True) as response:
        response.raise_for_status()
        content_type = (response.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        extension = _CONTENT_TYPES.get(content_type)
        if extension is None:
            lowered = url.split("?", 1)[0].lower()
            extension = next(("jpg" if e == "jpeg" else e for e in ("png", "jpg", "jpeg", "webp", "gif")
                              if lowered.endswith("." + e)), "png")
        path = _cache_path(prefix, extension)
        written = 0
        try:
            with path.open("wb") as fh:
                for chunk in response.iter_bytes(64 * 1024):
                    written += len(chunk)
                    if written > max_bytes:
                        raise ValueError(f"Image at {url} exceeds {max_bytes // (1024 * 1024)}MB cap; refusing to cache.")
                    fh.write(chunk)
            if written == 0:
                raise ValueError(f"Image at {url} returned 0 bytes; refusing to cache.")
        except BaseException:
            path.unlink(missing_ok=True)
            raise
    return path


def success_response(*, image: str, model: str, prompt: str, aspect_ratio: str, provider: str,
                     modality: str = "text", extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    payload: Dict[str, Any] = {"success": True, "image": image, "model": model, "prompt": prompt,
                               "aspect_ratio": aspect_ratio, "modality": modality, "provider": provider}
    for key, value in (extra or {}).items():
        payload.setdefault(key, value)
    return payload


def error_response(*, error: str, error_type: str = "provider_error", provider: str = "", model: str = "",
                   prompt: str = "", aspect_ratio: str = DEFAULT_ASPECT_RATIO) -> Dict[str, Any]:
    return {"success": False, "image": None, "error": error, "error_type": error_type, "model": model,
            "prompt": prompt, "aspect_ratio": aspect_ratio, "provider": provider}
