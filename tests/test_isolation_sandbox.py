"""plugin_llm/plugins/isolation/sandbox.py: how an out-of-process plugin's child is started and confined.

Every test spawns a real Python child from :func:`child_spec` (a tiny probe
script, not the worker) and asserts from inside it; bubblewrap is the real
``bwrap`` (``.ci/run`` installs it), its absence is a real PATH without it or a
real ``bwrap`` that fails.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from plugin_llm.plugins.isolation import sandbox
from plugin_llm.plugins.isolation.sandbox import (
    DEFAULT_LIMITS,
    SandboxLimits,
    bubblewrap_status,
    child_spec,
    parse_limits,
)
from tests.bounded import run_bounded

ROOT = Path(__file__).resolve().parents[1]
HOST_KEY = "sk-sandbox-host-env-canary-0123456789abcdef"
DOTENV_KEY = "sk-sandbox-dotenv-canary-0123456789abcdef"
AUTH_KEY = "sk-sandbox-authjson-canary-0123456789abcdef"
KEY_ENV_KEY = "sk-sandbox-keyenv-canary-0123456789abcdef"
PLUGIN_TOKEN = "plugin-own-token-0123456789"
CONFINEMENTS = ["bubblewrap", "process"]

# What the child reports about itself, as one JSON line: ``python -c PROBE <json args>``.
PROBE = textwrap.dedent(r"""
    import json, os, resource, sys
    args = json.loads(sys.argv[1])

    def attempt(fn):
        try:
            return ["ok", fn()]
        except BaseException as exc:
            return [type(exc).__name__, str(exc)[:300]]

    def read(path):
        with open(path, "rb") as f:
            return f.read(100000).decode("latin-1")

    def write(path):
        with open(path, "w") as f:
            f.write("x")
        return path

    out = {"env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid(),
           "limits": {n: list(resource.getrlimit(getattr(resource, n)))
                      for n in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_CORE")},
           "status": dict(l.split(":\t", 1) for l in read("/proc/self/status").splitlines() if ":\t" in l)}
    for name, path in args.get("read", {}).items():
        out["read:" + name] = attempt(lambda: read(path))
    for name, path in args.get("write", {}).items():
        out["write:" + name] = attempt(lambda: write(path))
    for name in args.get("imports", []):
        out["import:" + name] = attempt(lambda: __import__(name).__name__)
    if "allocate_mb" in args:
        out["allocate"] = attempt(lambda: len(bytearray(args["allocate_mb"] * 1024 * 1024)))
    if "open_files" in args:
        kept = []
        out["open_files"] = attempt(lambda: [kept.append(open(os.devnull)) for _ in range(args["open_files"])] and len(kept))
    if "connect" in args:
        import socket
        out["connect"] = attempt(lambda: socket.create_connection(("127.0.0.1", args["connect"]), timeout=5).close())
    if "mkdir_locked" in args:
        locked = os.path.join(os.environ["HOME"], "locked", "deeper")
        os.makedirs(locked)
        open(os.path.join(locked, "file"), "w").close()
        os.chmod(locked, 0)
        os.chmod(os.path.dirname(locked), 0o500)
    print(json.dumps(out))
""")


@pytest.fixture
def plugin_dir(hermes_home: Path) -> Path:
    d = hermes_home / "plugins" / "probe"
    d.mkdir(parents=True)
    (d / "plugin.yaml").write_text("name: probe\nrequires_env: [PROBE_PLUGIN_TOKEN]\n", encoding="utf-8")
    (d / "__init__.py").write_text("MARKER = 'plugin code readable'\n", encoding="utf-8")
    return d


@pytest.fixture
def secrets(hermes_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Path]:
    """Canary keys where a host keeps them: its environment, <home>/.env, auth.json; files in HOME and /tmp."""
    monkeypatch.setenv("OPENAI_API_KEY", HOST_KEY)
    monkeypatch.setenv("SANDBOX_KEY_ENV_VAR", KEY_ENV_KEY)  # named by auth.json's key_env
    (hermes_home / ".env").write_text(f"ANTHROPIC_API_KEY={DOTENV_KEY}\nPROBE_PLUGIN_TOKEN={PLUGIN_TOKEN}\n",
                                      encoding="utf-8")
    auth = hermes_home / "auth.json"
    auth.write_text(json.dumps({"providers": {"openai": {"api_key": AUTH_KEY},
                                              "groq": {"key_env": "SANDBOX_KEY_ENV_VAR"}}}), encoding="utf-8")
    os.chmod(auth, 0o600)
    user_home = Path(os.environ["HOME"])
    user_home.mkdir(exist_ok=True)
    (user_home / ".netrc").write_text(f"machine example.com password {HOST_KEY}\n", encoding="utf-8")
    host_tmp = tmp_path / "host-temp-file"
    host_tmp.write_text(HOST_KEY, encoding="utf-8")
    return {"auth": auth, "netrc": user_home / ".netrc", "host_tmp": host_tmp}


def spawn(plugin_dir: Path, hermes_home: Path, confinement: str = "bubblewrap", *,
          limits: SandboxLimits = DEFAULT_LIMITS, requires_env=("PROBE_PLUGIN_TOKEN",), **kwargs):
    # harden_host=False: the pytest process stays dumpable (test_process_confinement_hardens_the_host checks it)
    spec = child_spec(plugin_key="probe", plugin_dir=plugin_dir, requires_env=list(requires_env),
                      hermes_home=hermes_home, limits=limits, python_args=["-c", PROBE, "{}"],
                      **{"use_bubblewrap": confinement == "bubblewrap", "harden_host": False, **kwargs})
    if confinement == "bubblewrap":
        assert spec.confinement == "bubblewrap", f"bubblewrap is not usable here: {spec.reason} (.ci/run installs it)"
    else:
        assert spec.confinement == "process"
    return spec


def probe(spec, **args) -> dict:
    argv = [*spec.argv[:-1], json.dumps(args)]

    def run():
        return subprocess.run(argv, env=spec.env, cwd=spec.cwd, preexec_fn=spec.preexec_fn,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)

    done = run_bounded(run, 90)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def run_probe(plugin_dir, hermes_home, confinement="bubblewrap", *, spec_kwargs=None, **args) -> tuple[dict, object]:
    spec = spawn(plugin_dir, hermes_home, confinement, **(spec_kwargs or {}))
    try:
        return probe(spec, **args), spec
    finally:
        spec.cleanup()


# ------------------------------------------------------------------ environment
@pytest.mark.parametrize("confinement", CONFINEMENTS)
def test_environment_is_an_allowlist_with_the_plugins_own_variables(plugin_dir, hermes_home, secrets, confinement):
    out, spec = run_probe(plugin_dir, hermes_home, confinement)
    env = out["env"]
    values = "\n".join(f"{k}={v}" for k, v in env.items())
    for canary in (HOST_KEY, DOTENV_KEY, AUTH_KEY, KEY_ENV_KEY):
        assert canary not in values
    assert "OPENAI_API_KEY" not in env and "ANTHROPIC_API_KEY" not in env and "SANDBOX_KEY_ENV_VAR" not in env
    assert "HERMES_HOME" not in env
    assert env["PROBE_PLUGIN_TOKEN"] == PLUGIN_TOKEN  # from <home>/.env, as the host loads it
    assert env["PATH"] == os.environ["PATH"]
    assert env["HOME"] == env["TMPDIR"] == out["cwd"] == str(spec.scratch)
    # no capabilities (also when the host runs as root) and no way to gain any through a setuid binary
    assert out["status"]["CapEff"] == out["status"]["CapPrm"] == out["status"]["CapAmb"] == "0000000000000000"
    assert out["status"]["NoNewPrivs"] == "1"
    allowed = set(sandbox.PASSED_ENV) | {"HOME", "TMPDIR", "PWD", "MALLOC_ARENA_MAX", "PYTHONUSERBASE",
                                         "PROBE_PLUGIN_TOKEN", "LC_CTYPE"}
    assert set(env) - allowed <= {k for k in env if k.startswith("LC_") or k.lower().endswith("_proxy")}


def test_requires_env_prefers_the_host_environment_over_dotenv(plugin_dir, hermes_home, secrets, monkeypatch):
    monkeypatch.setenv("PROBE_PLUGIN_TOKEN", "from-the-host-environment")
    out, _ = run_probe(plugin_dir, hermes_home, "process")
    assert out["env"]["PROBE_PLUGIN_TOKEN"] == "from-the-host-environment"


@pytest.mark.parametrize("confinement", CONFINEMENTS)
def test_requires_env_naming_a_credential_variable_is_withheld(plugin_dir, hermes_home, secrets, caplog, confinement):
    caplog.set_level(logging.WARNING, logger="plugin_llm.plugins")
    wanted = ("PROBE_PLUGIN_TOKEN", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "SANDBOX_KEY_ENV_VAR", "HERMES_HOME")
    out, spec = run_probe(plugin_dir, hermes_home, confinement, spec_kwargs={"requires_env": wanted})
    assert spec.withheld_env == wanted[1:]
    assert out["env"]["PROBE_PLUGIN_TOKEN"] == PLUGIN_TOKEN
    for name in wanted[1:]:
        assert name not in out["env"]
    logged = caplog.text
    assert "OPENAI_API_KEY" in logged and "withheld" in logged
    for canary in (HOST_KEY, DOTENV_KEY, KEY_ENV_KEY, PLUGIN_TOKEN):
        assert canary not in logged and canary not in repr(spec)


FALLBACK_KEY_VARS = ("NOVITA_API_KEY", "NSCALE_API_KEY", "LM_STUDIO_API_KEY", "GITHUB_API_KEY", "HF_TOKEN",
                     "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_CLIENT_SECRET", "GOOGLE_APPLICATION_CREDENTIALS",
                     "WATSONX_ZENAPIKEY", "PLUGIN_LLM_SERVICE_TOKEN", "HTTP_PROXY", "https_proxy")


def test_requires_env_never_passes_a_variable_any_route_reads_a_key_from(plugin_dir, hermes_home, monkeypatch,
                                                                        caplog):
    caplog.set_level(logging.WARNING, logger="plugin_llm.plugins")
    for name in FALLBACK_KEY_VARS[: len(FALLBACK_KEY_VARS) // 2]:
        monkeypatch.setenv(name, f"http://user:{HOST_KEY}@proxy.internal:1")
    monkeypatch.setenv("MY_SERVICE_API_KEY", "the-plugins-own-key")  # a plugin's own, not a provider's
    (hermes_home / ".env").write_text("".join(f"{n}=http://user:{DOTENV_KEY}@proxy.internal:1\n"
                                              for n in FALLBACK_KEY_VARS[len(FALLBACK_KEY_VARS) // 2:]))
    wanted = ("MY_SERVICE_API_KEY", *FALLBACK_KEY_VARS)
    out, spec = run_probe(plugin_dir, hermes_home, "process", spec_kwargs={"requires_env": wanted})
    assert spec.withheld_env == FALLBACK_KEY_VARS
    values = json.dumps(out["env"])
    assert HOST_KEY not in values and DOTENV_KEY not in values
    assert out["env"]["MY_SERVICE_API_KEY"] == "the-plugins-own-key"
    assert "NOVITA_API_KEY" in caplog.text and "AWS_SECRET_ACCESS_KEY" in caplog.text and "withheld" in caplog.text


def test_proxy_settings_pass_without_credentials_only(plugin_dir, hermes_home, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://user:secret-proxy-pass@proxy.internal:3128")
    out, _ = run_probe(plugin_dir, hermes_home, "process")
    assert out["env"]["HTTPS_PROXY"] == "http://proxy.internal:3128"
    assert "HTTP_PROXY" not in out["env"]


@pytest.mark.parametrize("confinement", CONFINEMENTS)
def test_host_pythonpath_is_kept_and_readable(plugin_dir, hermes_home, tmp_path, monkeypatch, confinement):
    lib = tmp_path / "extra-lib"
    lib.mkdir()
    (lib / "sandbox_extra_module.py").write_text("VALUE = 1\n", encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(lib))
    shared = tmp_path / "shared-libs"  # an interpreter's own shared libraries outside the system paths
    shared.mkdir()
    (shared / "libexample.so").write_text("not really a library", encoding="utf-8")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(shared))
    out, _ = run_probe(plugin_dir, hermes_home, confinement, imports=["sandbox_extra_module", "plugin_llm"],
                       read={"shared_lib": str(shared / "libexample.so")})
    assert out["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(lib)
    assert out["env"]["LD_LIBRARY_PATH"] == str(shared) and out["read:shared_lib"][0] == "ok"
    assert out["import:sandbox_extra_module"] == ["ok", "sandbox_extra_module"]
    assert out["import:plugin_llm"] == ["ok", "plugin_llm"]


def test_a_home_inside_a_directory_that_is_bound_back_stays_hidden(tmp_path, monkeypatch):
    lib = tmp_path / "checkout"
    home = lib / "hermes-home"
    (home / "plugins" / "probe").mkdir(parents=True)
    (lib / "sandbox_checkout_module.py").write_text("VALUE = 1\n", encoding="utf-8")
    (home / "auth.json").write_text(json.dumps({"providers": {"openai": {"api_key": AUTH_KEY}}}), encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(lib))
    out, _ = run_probe(home / "plugins" / "probe", home, "bubblewrap", imports=["sandbox_checkout_module"],
                       read={"auth": str(home / "auth.json")})
    assert out["import:sandbox_checkout_module"][0] == "ok"
    assert out["read:auth"][0] == "FileNotFoundError"


def test_a_linked_plugin_is_readable_at_its_path_in_the_hidden_home(hermes_home, tmp_path):
    """``plugins install --link DIR`` leaves a symlink in <home>/plugins/: the worker imports it by that path."""
    target = tmp_path / "dev-checkout" / "probe"
    target.mkdir(parents=True)
    (target / "__init__.py").write_text("MARKER = 'linked'\n", encoding="utf-8")
    (hermes_home / "plugins").mkdir()
    link = hermes_home / "plugins" / "probe"
    link.symlink_to(target, target_is_directory=True)
    (hermes_home / "config.yaml").write_text("plugins: {enabled: [probe]}\n", encoding="utf-8")
    out, _ = run_probe(link, hermes_home, "bubblewrap",
                       read={"via_link": str(link / "__init__.py"), "config": str(hermes_home / "config.yaml")})
    assert out["read:via_link"] == ["ok", "MARKER = 'linked'\n"]
    assert out["read:config"][0] == "FileNotFoundError"


def test_relative_pythonpath_entries_are_made_absolute(plugin_dir, hermes_home, tmp_path, monkeypatch):
    (tmp_path / "rel-lib").mkdir()
    (tmp_path / "rel-lib" / "sandbox_relative_module.py").write_text("VALUE = 1\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "rel-lib")
    out, _ = run_probe(plugin_dir, hermes_home, "bubblewrap", imports=["sandbox_relative_module"])
    assert out["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "rel-lib")
    assert out["import:sandbox_relative_module"][0] == "ok"


def test_scratch_is_private_and_cleanup_removes_it(plugin_dir, hermes_home):
    spec = spawn(plugin_dir, hermes_home, "bubblewrap")
    assert stat.S_IMODE(spec.scratch.stat().st_mode) == 0o700
    assert "probe" in spec.scratch.name
    probe(spec, mkdir_locked=True)  # the child leaves a directory without permissions behind
    assert (spec.scratch / "locked").exists()
    spec.cleanup()
    assert not spec.scratch.exists()
    spec.cleanup()  # idempotent


# ------------------------------------------------------------------ resource limits
@pytest.mark.parametrize("confinement", CONFINEMENTS)
def test_resource_limits_are_in_effect_in_the_child(plugin_dir, hermes_home, confinement):
    limits = SandboxLimits(memory_mb=256, cpu_seconds=7, open_files=40)
    out, _ = run_probe(plugin_dir, hermes_home, confinement, spec_kwargs={"limits": limits},
                       allocate_mb=512, open_files=60)
    assert out["limits"]["RLIMIT_AS"] == [256 * 1024 * 1024] * 2
    assert out["limits"]["RLIMIT_CPU"] == [7, 12]  # SIGXCPU at the limit, SIGKILL 5 s later
    assert out["limits"]["RLIMIT_NOFILE"] == [40, 40]
    assert out["limits"]["RLIMIT_CORE"] == [0, 0]
    assert out["allocate"][0] == "MemoryError"  # the child fails, not the host
    assert out["open_files"][0] == "OSError" and "Too many open files" in out["open_files"][1]


@pytest.mark.slow
def test_a_child_dies_with_its_host(hermes_home, plugin_dir, tmp_path):
    """PR_SET_PDEATHSIG (and bwrap's --die-with-parent): killing the host kills the child."""
    host = textwrap.dedent(f"""
        import subprocess, sys, time
        from pathlib import Path
        from plugin_llm.plugins.isolation.sandbox import DEFAULT_LIMITS, child_spec
        spec = child_spec(plugin_key="probe", plugin_dir=Path({str(plugin_dir)!r}), requires_env=[],
                          hermes_home=Path({str(hermes_home)!r}), limits=DEFAULT_LIMITS,
                          python_args=["-c", "import time; time.sleep(120)"], use_bubblewrap=sys.argv[1] == "1")
        child = subprocess.Popen(spec.argv, env=spec.env, cwd=spec.cwd, preexec_fn=spec.preexec_fn)
        print(child.pid, spec.scratch, flush=True)
        time.sleep(120)
    """)
    for use_bwrap in ("1", "0"):
        parent = subprocess.Popen([sys.executable, "-c", host, use_bwrap], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            pid_text, scratch = run_bounded(parent.stdout.readline, 60).split()
            pid = int(pid_text)
            assert _alive(pid)
            parent.kill()
            parent.wait()

            def gone() -> None:
                while _alive(pid):
                    time.sleep(0.01)  # polling, not a timing assertion: run_bounded is the hang guard

            run_bounded(gone, 30)
        finally:
            parent.kill()
            parent.wait()
            parent.stdout.close()
        sandbox._remove_tree(Path(scratch))


@pytest.mark.parametrize("harden", [True, False])
def test_process_confinement_hardens_the_host(hermes_home, plugin_dir, harden):
    """Without bubblewrap the child shares /proc and the OS user: the host is made non-dumpable, so the
    environment it started with (a provider key) cannot be read from /proc/<host pid>/environ."""
    host = textwrap.dedent(f"""
        import json, os, subprocess, sys
        if os.geteuid() == 0 and os.environ.get("SANDBOX_TEST_NO_CAPS") != "1":
            # as root, a host without capabilities stands in for an ordinary user's host (the child has none
            # either, so only the dumpable flag decides): empty the bounding set, exec again
            import ctypes
            libc = ctypes.CDLL(None)
            for cap in range(int(open("/proc/sys/kernel/cap_last_cap").read()) + 1):
                libc.prctl(24, ctypes.c_ulong(cap), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
            os.environ["SANDBOX_TEST_NO_CAPS"] = "1"
            os.execv(sys.executable, sys.orig_argv)
        from pathlib import Path
        from plugin_llm.plugins.isolation.sandbox import DEFAULT_LIMITS, child_spec
        spec = child_spec(plugin_key="probe", plugin_dir=Path({str(plugin_dir)!r}), requires_env=[],
                          hermes_home=Path({str(hermes_home)!r}), limits=DEFAULT_LIMITS,
                          python_args=["-c", sys.argv[1], json.dumps({{"read": {{"host": f"/proc/{{os.getpid()}}/environ",
                                                                               "host_mem": f"/proc/{{os.getpid()}}/mem"}}}})],
                          use_bubblewrap=False, harden_host=sys.argv[2] == "1")
        try:
            done = subprocess.run(spec.argv, env=spec.env, cwd=spec.cwd, preexec_fn=spec.preexec_fn,
                                  capture_output=True, text=True, timeout=60)
        finally:
            spec.cleanup()
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
    """)
    env = {**os.environ, "OPENAI_API_KEY": HOST_KEY}  # in the host's real environment block, as at a real start
    done = run_bounded(lambda: subprocess.run([sys.executable, "-c", host, PROBE, "1" if harden else "0"], cwd=ROOT,
                                              env=env, capture_output=True, text=True, timeout=60), 90)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    if harden:
        assert out["read:host"][0] == "PermissionError" and out["read:host_mem"][0] == "PermissionError"
    else:  # what it protects against: a same-user child reads the key straight out of the host's environ
        assert out["read:host"][0] == "ok" and HOST_KEY in out["read:host"][1]


def _alive(pid: int) -> bool:
    """Running (not exited, not a zombie waiting for a reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


# ------------------------------------------------------------------ bubblewrap
def test_bubblewrap_hides_the_homes_the_host_and_its_temp_files(plugin_dir, hermes_home, secrets):
    out, spec = run_probe(
        plugin_dir, hermes_home, "bubblewrap",
        read={"auth": str(secrets["auth"]), "dotenv": str(hermes_home / ".env"), "netrc": str(secrets["netrc"]),
              "host_tmp": str(secrets["host_tmp"]), "host_environ": f"/proc/{os.getpid()}/environ",
              "plugin": str(plugin_dir / "__init__.py")},
        write={"plugin_dir": str(plugin_dir / "written"), "scratch": str(Path(os.environ["HOME"]) / "x")},
        imports=["plugin_llm"],
    )
    for name in ("auth", "dotenv", "netrc", "host_tmp", "host_environ"):
        assert out["read:" + name][0] == "FileNotFoundError", (name, out["read:" + name])
    assert out["read:plugin"] == ["ok", "MARKER = 'plugin code readable'\n"]  # bound back in, under the hidden home
    assert out["write:plugin_dir"][0] == "OSError" and "Read-only" in out["write:plugin_dir"][1]
    assert not (plugin_dir / "written").exists()
    assert out["import:plugin_llm"] == ["ok", "plugin_llm"]
    assert out["pid"] < 10 and out["pid"] != os.getpid()  # its own PID namespace and /proc
    assert spec.argv[0] == bubblewrap_status().path and "--die-with-parent" in spec.argv


def test_without_bubblewrap_files_of_the_same_user_stay_readable(plugin_dir, hermes_home, secrets):
    """The honest limit of process confinement (README): no keys in the environment, but files are readable."""
    out, spec = run_probe(plugin_dir, hermes_home, "process", read={"auth": str(secrets["auth"])})
    assert out["read:auth"][0] == "ok"
    assert spec.reason == "bubblewrap is turned off by the configuration"
    assert spec.argv[0] == sys.executable


def test_network_is_none_by_default_and_the_hosts_on_request(plugin_dir, hermes_home):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        shared, shared_spec = run_probe(plugin_dir, hermes_home, "bubblewrap", connect=port,
                                        spec_kwargs={"share_network": True})
        cut, spec = run_probe(plugin_dir, hermes_home, "bubblewrap", connect=port,
                              spec_kwargs={"share_network": False})
        default, default_spec = run_probe(plugin_dir, hermes_home, "bubblewrap", connect=port)
        plain, plain_spec = run_probe(plugin_dir, hermes_home, "process", connect=port)
    assert shared["connect"] == ["ok", None]
    assert cut["connect"][0] in ("OSError", "ConnectionRefusedError") and "--unshare-net" in spec.argv
    assert default["connect"][0] in ("OSError", "ConnectionRefusedError") and "--unshare-net" in default_spec.argv
    assert shared_spec.share_network and not spec.share_network and not default_spec.share_network
    # without bubblewrap a plain process cannot be cut off: the default is then the host's network, and says so
    assert plain["connect"] == ["ok", None] and plain_spec.share_network


def test_no_bwrap_on_path_falls_back_to_process_confinement(plugin_dir, hermes_home, tmp_path, monkeypatch, secrets):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    status = bubblewrap_status()
    assert not status.usable and status.path is None
    assert "bwrap is not on PATH" in status.reason and "apt-get install bubblewrap" in status.reason
    spec = child_spec(plugin_key="probe", plugin_dir=plugin_dir, requires_env=["PROBE_PLUGIN_TOKEN"],
                      hermes_home=hermes_home, limits=DEFAULT_LIMITS, python_args=["-c", PROBE, "{}"],
                      harden_host=False)
    try:
        assert spec.confinement == "process" and spec.reason == status.reason
        out = probe(spec)
    finally:
        spec.cleanup()
    assert out["env"]["PROBE_PLUGIN_TOKEN"] == PLUGIN_TOKEN and HOST_KEY not in json.dumps(out["env"])


def test_a_bwrap_that_cannot_run_here_is_reported_and_tried_once(plugin_dir, hermes_home, tmp_path, monkeypatch):
    bin_dir = tmp_path / "broken-bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    fake = bin_dir / "bwrap"
    fake.write_text(f"#!/bin/sh\necho run >> {calls}\n"
                    "echo 'bwrap: No permissions to creating new namespace, likely because the kernel does not "
                    "allow non-privileged user namespaces.' >&2\nexit 1\n", encoding="utf-8")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    first, second = bubblewrap_status(), bubblewrap_status()
    assert first == second and not first.usable and first.path == str(fake)
    assert "trial run failed: bwrap: No permissions to creating new namespace" in first.reason
    assert "user namespaces look disabled" in first.reason
    assert calls.read_text().count("run") == 1  # cached per binary
    out, spec = run_probe(plugin_dir, hermes_home, "process", spec_kwargs={"use_bubblewrap": True})
    assert spec.reason == first.reason and spec.argv[0] == sys.executable and out["env"]["HOME"] == str(spec.scratch)


# ------------------------------------------------------------------ parse_limits
def test_parse_limits_defaults_and_subsets():
    assert parse_limits(None, "plugins.isolation_limits") == DEFAULT_LIMITS
    assert parse_limits({}, "plugins.isolation_limits") == DEFAULT_LIMITS
    got = parse_limits({"memory_mb": 2048}, "plugins.entries.x.isolation_limits")
    assert got == SandboxLimits(memory_mb=2048, cpu_seconds=DEFAULT_LIMITS.cpu_seconds,
                                open_files=DEFAULT_LIMITS.open_files)
    assert DEFAULT_LIMITS.memory_mb >= 512  # a Python child with a plugin needs a few hundred MiB of address space


@pytest.mark.parametrize("raw, expected", [
    ({"memory_md": 512}, "plugins.entries.x.isolation_limits.memory_md: unknown limit (did you mean 'memory_mb'?)"),
    ({"memory_mb": "512"}, "plugins.entries.x.isolation_limits.memory_mb: expected a whole number"),
    ({"cpu_seconds": True}, "plugins.entries.x.isolation_limits.cpu_seconds: expected a whole number"),
    ({"open_files": 1.5}, "got float"),
    ({"memory_mb": 16}, "memory_mb: 16 is out of range"),
    ({"cpu_seconds": 0}, "fix: e.g. cpu_seconds: 600"),
    ({"open_files": 10**40}, "open_files: a huge number is out of range"),
    ([512], "plugins.entries.x.isolation_limits: expected a mapping of memory_mb, cpu_seconds, open_files, got list"),
    ({3: 1}, "keys must be limit names"),
])
def test_parse_limits_errors_name_the_key_and_the_fix(raw, expected):
    with pytest.raises(ValueError) as info:
        parse_limits(raw, "plugins.entries.x.isolation_limits")
    assert expected in str(info.value)


def test_parse_limits_never_echoes_unbounded_input():
    huge = "k" * 100_000
    with pytest.raises(ValueError) as info:
        parse_limits({huge: 1}, "where")
    assert len(str(info.value)) < 400
    with pytest.raises(ValueError) as info:
        parse_limits({"memory_mb": huge}, "where")
    assert huge[:100] not in str(info.value)


# ------------------------------------------------------------------ doctor
def _doctor_line(capsys) -> dict:
    from plugin_llm.cli.main import main

    main(["doctor", "--json"])
    checks = json.loads(capsys.readouterr().out)["checks"]
    found = [c for c in checks if c["check"] == "bubblewrap"]
    assert len(found) == 1, checks
    return found[0]


def test_doctor_says_whether_bubblewrap_is_in_effect_and_why_not(capsys, tmp_path, monkeypatch):
    line = _doctor_line(capsys)
    assert line["status"] == "OK" and line["message"].startswith("in effect for out-of-process plugins")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    line = _doctor_line(capsys)
    assert line["status"] == "OK"  # no plugin is isolated: information, not a warning
    assert line["message"].startswith("not in effect: bwrap is not on PATH")
    assert "process confinement only" in line["message"]


@pytest.mark.slow
def test_doctor_warns_when_an_isolated_plugin_runs_without_bubblewrap(capsys, hermes_home, tmp_path, monkeypatch):
    from tests.conftest import write_config
    from tests.plugin_fixtures import write_plugin

    write_plugin(hermes_home / "plugins", "guarded", "def register(ctx):\n    ctx.register_command('g', lambda raw: 'ok')\n")
    write_config(hermes_home, "plugins:\n  enabled: [guarded]\n  entries:\n    guarded: {isolation: process}\n")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    line = _doctor_line(capsys)
    assert line["status"] == "WARN" and line["message"].startswith("not in effect: bwrap is not on PATH")
    assert line["message"].endswith("isolated plugins: guarded")
    assert "apt-get install bubblewrap" in line["fix"]
