"""Load every plugin bundled with an installed hermes-agent wheel here, and count per kind how many load.

    python benchmarks/hermes_bundled_report.py [PLUGINS_DIR | SITE_PACKAGES] [--json] [--failures]

The plugins are copied unchanged into a temporary ``$HERMES_HOME/plugins/``
(Hermes itself is never imported: run this with the project's interpreter,
where hermes-agent is *not* installed, to measure the compat layer). Every
plugin is enabled by the key Hermes gives it; each memory provider is then
selected in turn (``memory.provider: <name>``). Without an argument the
script looks for the ``plugins/`` directory of an installed ``hermes-agent``
distribution (this interpreter's, then ``$HERMES_AGENT_SITE_PACKAGES``) and
exits 0 with a note when there is none.

Printed: one row per kind (found, loaded, skipped, failed, not loaded), whether
every plugin got Hermes's key, and with ``--failures`` one line per failure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def find_plugins_dir(arg: str | None) -> Path | None:
    candidates: list[Path] = []
    if arg:
        p = Path(arg)
        candidates += [p / "plugins", p]
    else:
        try:
            from importlib.metadata import distribution

            dist = distribution("hermes-agent")
            candidates.append(Path(str(dist.locate_file("plugins"))))
        except Exception:
            pass
        env = os.environ.get("HERMES_AGENT_SITE_PACKAGES")
        if env:
            candidates.append(Path(env) / "plugins")
    for c in candidates:
        if c.is_dir() and any(c.rglob("plugin.yaml")):
            return c
    return None


def hermes_key(root: Path, manifest: Path) -> str:
    """The key hermes_cli/plugins.py gives (path-derived when nested, manifest name at the top)."""
    import yaml

    rel = manifest.parent.relative_to(root)
    if len(rel.parts) == 2:
        return "/".join(rel.parts)
    data = yaml.safe_load(manifest.read_text(encoding="utf-8")) or {}
    return str(data.get("name", rel.parts[0]))


def write_config(home: Path, enabled: list[str], memory: str | None = None) -> None:
    import yaml

    config = {"plugins": {"enabled": enabled, "hook_timeout": 20}}
    if memory:
        config["memory"] = {"provider": memory}
    (home / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")


def kind_of(p: dict) -> str:
    key = p["key"]
    if p["kind"] == "exclusive" and key.startswith("memory/"):
        return "memory"
    if key.startswith("image_gen/"):
        return "image_gen"
    return p["kind"] or "standalone"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--failures", action="store_true")
    args = parser.parse_args(argv)
    source = find_plugins_dir(args.path)
    if source is None:
        print("no hermes-agent plugins directory found (pass PLUGINS_DIR or SITE_PACKAGES); nothing measured")
        return 0
    if "hermes_cli" in sys.modules or _importable("hermes_cli"):
        print("note: real Hermes is importable here; its modules are used instead of the compat layer",
              file=sys.stderr)

    from plugin_llm.plugins import PluginManager

    tmp = Path(tempfile.mkdtemp(prefix="hermes-bundled-"))
    home = tmp / "home"
    home.mkdir()
    os.environ["HERMES_HOME"] = str(home)
    shutil.copytree(source, home / "plugins", ignore=shutil.ignore_patterns("__pycache__", "tests", "*.pyc"))
    manifests = sorted((home / "plugins").rglob("plugin.yaml"))
    expected = {hermes_key(home / "plugins", m) for m in manifests}

    write_config(home, sorted(expected))
    manager = PluginManager(home, audit_events=False)
    found = {p["key"]: p for p in manager.list_plugins()}
    memory_keys = [k for k, p in found.items() if p["kind"] == "exclusive" and k.startswith("memory/")]
    rows: dict[str, dict] = {k: p for k, p in found.items() if k not in memory_keys}
    for key in memory_keys:  # one selection at a time, as an operator would
        write_config(home, [k for k in sorted(expected) if k not in memory_keys], memory=key.split("/", 1)[1])
        m = PluginManager(home, audit_events=False)
        rows[key] = next(p for p in m.list_plugins() if p["key"] == key)
        rows[key] = {**rows[key], "registered": bool(m.memory_providers)}

    per_kind: dict[str, Counter] = defaultdict(Counter)
    failures = []
    for key, p in sorted(rows.items()):
        kind = kind_of(p)
        per_kind[kind]["found"] += 1
        status = {"enabled": "loaded", "skipped": "skipped", "failed": "failed"}.get(p["status"], "not loaded")
        per_kind[kind][status] += 1
        if kind == "memory" and status == "loaded" and not p.get("registered"):
            per_kind[kind]["loaded"] -= 1
            per_kind[kind]["failed"] += 1
            failures.append((kind, key, "loaded but registered no memory provider"))
        if p["status"] == "failed":
            failures.append((kind, key, p["error"]))
    keys_ok = set(found) == expected
    report = {
        "source": str(source),
        "plugins": len(manifests),
        "hermes_keys": keys_ok,
        "key_mismatches": sorted(set(found) ^ expected),
        "per_kind": {k: dict(v) for k, v in sorted(per_kind.items())},
        "failures": [{"kind": k, "key": key, "error": e} for k, key, e in failures],
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{len(manifests)} bundled plugins from {source}")
        print(f"Hermes's keys for all: {'yes' if keys_ok else 'NO ' + str(report['key_mismatches'])}")
        print(f"{'kind':<16}{'found':>7}{'loaded':>8}{'skipped':>9}{'failed':>8}{'not loaded':>12}")
        for kind, c in sorted(per_kind.items()):
            print(f"{kind:<16}{c['found']:>7}{c['loaded']:>8}{c['skipped']:>9}{c['failed']:>8}{c['not loaded']:>12}")
        if args.failures:
            for kind, key, error in failures:
                print(f"  [{kind}] {key}: {str(error).splitlines()[0] if error else error}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _importable(name: str) -> bool:
    from importlib.util import find_spec

    try:
        return find_spec(name) is not None
    except (ImportError, ValueError):
        return False


if __name__ == "__main__":
    raise SystemExit(main())
