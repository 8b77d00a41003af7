"""`plugin-llm ... | head`: a reader that leaves early gets no traceback from us."""

from __future__ import annotations

import pytest

import os
import subprocess
import sys

from tests.conftest import write_config


@pytest.mark.slow
def test_a_closed_stdout_pipe_ends_the_command_quietly(hermes_home, tmp_path):
    entries = "".join(f"    plugin-{i}:\n      llm: {{allow_model_override: true}}\n" for i in range(400))
    write_config(hermes_home, "plugins:\n  entries:\n" + entries)  # far more output than a pipe buffer holds
    env = {**os.environ, "HERMES_HOME": str(hermes_home), "HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "plugin_llm.cli.main", "trust", "show"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(100)
    proc.stdout.close()  # like `| head -c 100`
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode(errors="replace")
    assert proc.returncode == 141
