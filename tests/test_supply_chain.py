"""The deployment lock and the known-malicious releases: requirements/deploy.txt matches pyproject.toml,
every pin carries a hash, and no known-bad litellm can be resolved, locked or go unnoticed by doctor."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from plugin_llm.supply_chain import KNOWN_MALICIOUS, check_distribution

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "deploy.txt"
#: the lock is generated for CPython 3.11 on Linux (see its header)
TARGET = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.0",
          "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
          "platform_python_implementation": "CPython", "implementation_name": "cpython"}


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _lock() -> dict[str, tuple[str, list[str]]]:
    """name -> (pinned version, sha256 hashes), from the requirement lines of the lock."""
    text = LOCK.read_text(encoding="utf-8")
    pins: dict[str, tuple[str, list[str]]] = {}
    for block in re.split(r"\n(?=[^\s#])", text):
        first = block.split("\\", 1)[0].strip()
        if not first or first.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[A-Za-z0-9,._-]+\])?==(\S+)", first)  # extras kept
        assert match, f"not an exact pin: {first!r}"
        pins[_name(match.group(1))] = (match.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    return pins


def test_every_dependency_is_pinned_in_the_lock_with_hashes():
    pins = _lock()
    assert pins, "the lock lists no package"
    for name, (version, hashes) in pins.items():  # pip install --require-hashes needs a hash on every line
        assert hashes, f"{name}=={version} has no hash"
    project = _pyproject()
    wanted = [Requirement(r) for r in project["project"]["dependencies"]]
    wanted += [Requirement(r) for r in project["build-system"]["requires"]]  # --no-build-isolation installs
    for req in wanted:
        if req.marker is not None and not req.marker.evaluate(TARGET):
            continue
        assert _name(req.name) in pins, f"{req} is not in {LOCK.name}: regenerate it (see its header)"
        version = pins[_name(req.name)][0]
        assert req.specifier.contains(version, prereleases=True), \
            f"{LOCK.name} pins {req.name}=={version}, outside pyproject.toml's {req}: regenerate it"


def test_the_lock_says_how_to_regenerate_it_and_locks_no_known_bad_release():
    header = LOCK.read_text(encoding="utf-8").split("\n", 3)[:2]
    assert "uv pip compile pyproject.toml requirements/deploy.in --generate-hashes" in header[1]
    assert "--python-version 3.11" in header[1] and "-o requirements/deploy.txt" in header[1]
    pins = _lock()
    for dist, versions in KNOWN_MALICIOUS.items():
        if _name(dist) in pins:
            assert pins[_name(dist)][0] not in versions


def test_pyproject_excludes_every_known_malicious_release_explicitly():
    deps = {_name(Requirement(r).name): Requirement(r) for r in _pyproject()["project"]["dependencies"]}
    for dist, versions in KNOWN_MALICIOUS.items():
        spec = deps[_name(dist)].specifier
        for version in versions:
            assert f"!={version}" in {str(s) for s in spec}, f"{dist} {version} is not excluded by name"
            # widening the range keeps them out: the exclusions alone refuse them
            alone = SpecifierSet(",".join(str(s) for s in spec if s.operator == "!="))
            assert not alone.contains(version)


def test_check_distribution_flags_a_known_bad_version_and_a_pth_file():
    clean = check_distribution("litellm", version_of=lambda n: "1.110.2", files_of=lambda n: ["litellm/__init__.py"])
    assert clean == []
    [bad] = check_distribution("litellm", version_of=lambda n: "v1.82.7 ", files_of=lambda n: [])
    assert "known-malicious" in bad.problem and "rotate every provider key" in bad.fix
    [pth] = check_distribution("litellm", version_of=lambda n: "1.110.2",
                               files_of=lambda n: ["litellm/__init__.py", "litellm_init.pth"])
    assert "litellm_init.pth" in pth.problem and "delete litellm_init.pth" in pth.fix
    assert check_distribution("litellm", version_of=lambda n: None, files_of=lambda n: ["x.pth"]) == []
