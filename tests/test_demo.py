"""``plugin-llm demo`` end to end: offline, every section's outcome, the user's home untouched."""

from __future__ import annotations

import os
import re
from pathlib import Path


from plugin_llm.cli.main import main


def _snapshot(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_demo_runs_every_section_offline_without_touching_the_home(hermes_home: Path, capsys):
    user_home = Path(os.environ["HOME"])
    before_home, before_user = _snapshot(hermes_home), _snapshot(user_home)

    assert main(["demo"]) == 0
    out = capsys.readouterr().out

    # 1. plugins
    assert re.search(r"hello-world\s+enabled", out) and re.search(r"image_gen/sketch\s+enabled", out)
    assert "failed" not in out
    # 2. plain completion (the local model's summary is the first sentence)
    assert "== 2. Plain completion" in out
    assert "Plugins ask the host for model calls instead of holding API keys." in out
    assert "provider=local model=local-echo-1" in out
    # 3. structured extraction with parsed JSON
    section3 = out.split("== 3.")[1].split("== 4.")[0]
    assert '"title": "Ship the 1.0 release"' in section3 and '"priority": "high"' in section3
    # 4. async fan-out: three results and the total
    section4 = out.split("== 4.")[1].split("== 5.")[0]
    assert all(label in section4 for label in ("summary:", "title:", "sentiment:"))
    assert "3 concurrent calls" in section4
    # 5. a tool that ran and one that the policy blocked
    assert "[tool hello_world] ran" in out and "Hello, Ada!" in out
    assert "[tool delete_file] BLOCKED" in out and "tool-guard" in out
    assert "workspace/notes.txt still exists: yes" in out
    # 6. trust denial with the exact config that would allow it
    section6 = out.split("== 6.")[1].split("== 7.")[0]
    assert "PluginLlmTrustError" in section6
    assert "plugins.entries.tldr.llm.allow_model_override" in section6
    assert "        tldr:\n          llm:\n            allow_model_override: true" in section6
    assert "model='local-echo-1' allowed" in section6
    # 7. audit trail: allowed async calls, the host's session calls, the denial
    section7 = out.split("== 7.")[1]
    assert re.search(r"async-fanout\s+complete\s+async\s+allowed\s+ok", section7)
    assert re.search(r"host\s+\S+\s+sync\s+allowed\s+ok", section7)
    assert re.search(r"tldr\s+complete\s+sync\s+denied\s+denied\s+gpt-4o", section7)
    assert "hash chain verified" in section7

    # the temporary home is gone and nothing was written to the real ones
    temp_home = Path(re.search(r"temporary home (\S+)", out).group(1))
    assert not temp_home.exists()
    assert _snapshot(hermes_home) == before_home
    assert _snapshot(user_home) == before_user
    assert os.environ["HERMES_HOME"] == str(hermes_home)  # restored


def test_demo_keep_keeps_the_temporary_home(hermes_home: Path, capsys):
    assert main(["demo", "--keep"]) == 0
    out = capsys.readouterr().out
    kept = Path(re.search(r"Demo home kept at (\S+)", out).group(1))
    try:
        assert (kept / "config.yaml").is_file()
        assert (kept / "plugins" / "tool-guard" / "plugin.yaml").is_file()
        assert (kept / "logs" / "agent.log").is_file()
        assert (kept / "workspace" / "notes.txt").is_file()
    finally:
        import shutil

        shutil.rmtree(kept, ignore_errors=True)


def test_demo_without_examples_is_a_clear_error(tmp_path: Path, capsys):
    assert main(["demo", "--examples", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "config_examples" in err and "--examples" in err and "Traceback" not in err
