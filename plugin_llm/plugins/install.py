"""Installing, updating and removing directory plugins.

``install``: SOURCE is ``owner/repo`` (a GitHub https URL), a git URL (``https://``, ``ssh://``,
``git@host:path``, ``file://``), any of those with ``#subdir``, or a local directory (``path`` or
``path#subdir``). Everything happens in a hidden staging directory inside ``plugins/``; only a
validated tree is moved into place with ``os.rename`` and ``plugins/.install-metadata.json``
updated. Whatever fails, nothing half-installed is left behind. The parts: SOURCE and git
(:mod:`.install_sources`), checking a tree (:mod:`.install_tree`), staging and committing
(:mod:`.install_staging`, what may be replaced: :mod:`.install_targets`), the record
(:mod:`.install_records`), update and remove (:mod:`.install_updates`) and ``.env``
(:mod:`.install_env`). Layout of git installs and ``update``: docs/design.md. None of them prints
anything or asks anything: the CLI does that.
"""

from __future__ import annotations

from pathlib import Path

from .install_env import is_secret_name, missing_env, read_env_file, write_env_values
from .install_records import (
    METADATA_FILENAME,
    InstalledPlugin,
    installed_plugins,
    read_metadata,
    resolve_installed,
    resolve_name,
)
from .install_sources import DEFAULT_GIT_TIMEOUT, InstallError, InstallSource, parse_source, validate_install_name
from .install_staging import StagedPlugin, check_target, commit_staged, discard_staged, stage_link, stage_plugin
from .install_tree import copy_example_files
from .install_updates import RemoveResult, UpdateResult, remove_plugin, update_plugin

__all__ = [
    "InstallError",
    "InstallSource",
    "StagedPlugin",
    "InstalledPlugin",
    "UpdateResult",
    "RemoveResult",
    "DEFAULT_GIT_TIMEOUT",
    "METADATA_FILENAME",
    "parse_source",
    "validate_install_name",
    "stage_plugin",
    "stage_link",
    "commit_staged",
    "check_target",
    "discard_staged",
    "install_plugin",
    "update_plugin",
    "remove_plugin",
    "read_metadata",
    "installed_plugins",
    "resolve_installed",
    "copy_example_files",
    "is_secret_name",
    "read_env_file",
    "write_env_values",
    "missing_env",
    "resolve_name",
]


def install_plugin(
    home: Path,
    source: str | InstallSource,
    *,
    force: bool = False,
    ref: str | None = None,
    category: str | None = None,
    timeout: float = DEFAULT_GIT_TIMEOUT,
) -> InstalledPlugin:
    """Stage and commit in one go (no prompts): what the CLI does minus the questions."""
    plugins_dir = Path(home) / "plugins"
    src = parse_source(source) if isinstance(source, str) else source
    staged = stage_plugin(plugins_dir, src, ref=ref, category=category, timeout=timeout)
    try:
        return commit_staged(staged, force=force)
    finally:
        discard_staged(staged)
