"""Known-malicious releases of what the gateway runs next to every provider key.

The gateway holds the keys in the process that imports litellm, so a poisoned
litellm release is a key stealer. :data:`KNOWN_MALICIOUS` is the one table of
such releases: ``pyproject.toml`` excludes them, ``plugin-llm doctor`` FAILs
when one is installed or when the installed distribution carries a ``.pth``
file (code that runs at every interpreter start: the poisoned releases'
vector). Read from package metadata only: nothing here imports the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

__all__ = ["KNOWN_MALICIOUS", "SupplyChainProblem", "installed_version", "distribution_files", "check_distribution"]

#: distribution -> {version: what it shipped}; keep pyproject.toml's exclusions in step
KNOWN_MALICIOUS: Mapping[str, Mapping[str, str]] = {
    "litellm": {
        "1.82.7": "a credential stealer (March 2026): a .pth file that runs at every interpreter start",
        "1.82.8": "a credential stealer (March 2026): a .pth file that runs at every interpreter start",
    },
}


@dataclass(frozen=True)
class SupplyChainProblem:
    distribution: str
    problem: str
    fix: str


def installed_version(name: str) -> str | None:
    """The installed version of a distribution from its metadata (None when not installed)."""
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def distribution_files(name: str) -> list[str] | None:
    """The files a distribution's RECORD lists, as written there (None when unknown)."""
    import importlib.metadata

    try:
        files = importlib.metadata.files(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    return None if files is None else [str(f) for f in files]


def _normalize(version: str) -> str:
    version = version.strip().lower()
    return version[1:] if version.startswith("v") else version


def check_distribution(
    name: str,
    *,
    version_of: Callable[[str], str | None] = installed_version,
    files_of: Callable[[str], Iterable[str] | None] = distribution_files,
) -> list[SupplyChainProblem]:
    """What is wrong with the installed ``name``: a known-malicious version, a ``.pth`` file it installed."""
    out: list[SupplyChainProblem] = []
    version = version_of(name)
    if version is None:
        return out
    bad = {_normalize(v): why for v, why in KNOWN_MALICIOUS.get(name, {}).items()}
    why = bad.get(_normalize(version))
    if why is not None:
        out.append(SupplyChainProblem(
            name, f"{name} {version} is a known-malicious release ({why}): treat every key this machine "
            "held as stolen",
            f"rotate every provider key, rebuild the environment from the hash-pinned lock "
            f"(pip install --require-hashes -r requirements/deploy.txt), and check for left-over .pth files",
        ))
    pth = sorted(f for f in files_of(name) or () if f.lower().endswith(".pth"))
    if pth:
        shown = ", ".join(pth[:5]) + (f" and {len(pth) - 5} more" if len(pth) > 5 else "")
        out.append(SupplyChainProblem(
            name, f"{name} {version} installed a .pth file ({shown}): code that runs at every Python start, "
            f"before any trust gate; {name} ships none",
            f"delete {shown} from site-packages, rotate every provider key, and reinstall {name} from the "
            "hash-pinned lock",
        ))
    return out
