"""``tools.lazy_deps``: optional packages a feature needs — checked, never installed.

Hermes can pip-install a backend's packages on first use. This host never
installs anything at run time: :func:`ensure` returns when the packages are
importable and otherwise raises :class:`FeatureUnavailable` naming the pip
package to install.
"""

from __future__ import annotations

import importlib.util
import re

__all__ = ["LAZY_DEPS", "FeatureUnavailable", "ensure", "is_available", "feature_specs", "feature_missing",
           "feature_install_command"]

#: feature -> pip requirement(s) (the features the bundled plugins of hermes-agent 0.19.0 ask for)
LAZY_DEPS: dict[str, tuple[str, ...]] = {
    "image.fal": ("fal-client",),
    "memory.honcho": ("honcho-ai",),
    "memory.hindsight": ("hindsight-client",),
    "memory.supermemory": ("supermemory",),
    "memory.mem0": ("mem0ai",),
    "search.exa": ("exa-py",),
    "search.firecrawl": ("firecrawl-py",),
    "search.parallel": ("parallel-web",),
    "tts.edge": ("edge-tts",),
    "tts.elevenlabs": ("elevenlabs",),
    "tool.vision": ("Pillow",),
}
#: pip distribution -> the module it installs, where they differ
_MODULES = {"honcho-ai": "honcho", "hindsight-client": "hindsight_client", "mem0ai": "mem0",
            "fal-client": "fal_client", "exa-py": "exa_py", "firecrawl-py": "firecrawl",
            "parallel-web": "parallel", "edge-tts": "edge_tts", "Pillow": "PIL"}


class FeatureUnavailable(RuntimeError):
    """A feature's packages are not installed (this host never installs them itself)."""

    def __init__(self, feature: str, missing: tuple[str, ...], reason: str) -> None:
        self.feature = feature
        self.missing = missing
        self.reason = reason
        specs = " ".join(missing)
        fix = f": pip install {specs}" if specs else ""
        super().__init__(f"Feature {feature!r} unavailable: {reason}{fix}")


def _module_of(spec: str) -> str:
    name = re.split(r"[\[<>=!~ ;]", spec, maxsplit=1)[0]
    return _MODULES.get(name, name.replace("-", "_"))


def feature_specs(feature: str) -> tuple[str, ...]:
    return LAZY_DEPS.get(feature, ())


def feature_missing(feature: str) -> tuple[str, ...]:
    missing = []
    for spec in feature_specs(feature):
        try:
            found = importlib.util.find_spec(_module_of(spec)) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(spec)
    return tuple(missing)


def is_available(feature: str) -> bool:
    return feature in LAZY_DEPS and not feature_missing(feature)


def feature_install_command(feature: str) -> str | None:
    specs = feature_specs(feature)
    return f"pip install {' '.join(specs)}" if specs else None


def ensure(feature: str, *, prompt: bool = True) -> None:
    """Return when ``feature``'s packages are importable; else raise :class:`FeatureUnavailable`."""
    if feature not in LAZY_DEPS:
        raise FeatureUnavailable(feature, (), "unknown feature (this host installs nothing at run time)")
    missing = feature_missing(feature)
    if missing:
        raise FeatureUnavailable(feature, missing, "its packages are not installed and this host never "
                                 "installs packages at run time")
