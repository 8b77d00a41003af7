"""Cold start: time to the first result in a fresh process, and its peak RSS.

Printed, in one run (``python benchmarks/bench_coldstart.py [--quick] [--rounds N] [--hermes-python PATH]``):
for each contender, fresh processes, interleaved (the order rotates every round), the median and
the spread (min-max) over the rounds of the time from spawning the process to its first result,
and its peak RSS (``os.wait4``'s rusage of that child); ratios against ``python -c pass`` and,
when a Hermes interpreter is given (``--hermes-python``, default ``$HERMES_PYTHON``), against
Hermes's first ``ctx.llm`` call on the same server.

Contenders: an allowed ``complete`` (and ``acomplete``) on a canned OpenAI-compatible server on
127.0.0.1 (its own process, from bench_gateway.py) on the own path and, as before it, through
litellm (``PLUGIN_LLM_OWN_PATH=0``); the same call on a ``deepseek-chat`` route (the same server as
its endpoint), both ways; a trust denial (a model override the plugin may not make); a call to the
embedded ``local`` model, both ways; and ``python -c pass``. Targets: a denial <= 0.35x Hermes's first call, the first HTTP call <= 1.0x, its
peak RSS <= 1.2x Hermes's, a ``local`` call <= 0.5x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway import MESSAGES, MODEL, ROOT, Hermes, server_process  # noqa: E402

MAX_ROUNDS = 50
HTTP_CALL = "from plugin_llm import PluginLlm\nPluginLlm('bench', home={home!r}).complete({messages!r})\n"
ASYNC_CALL = ("import asyncio\nfrom plugin_llm import PluginLlm\n"
              "asyncio.run(PluginLlm('bench', home={home!r}).acomplete({messages!r}))\n")
LOCAL_CALL = "from plugin_llm import PluginLlm\nPluginLlm('bench', home={local_home!r}).complete({messages!r})\n"
DEEPSEEK_CALL = "from plugin_llm import PluginLlm\nPluginLlm('bench', home={deepseek_home!r}).complete({messages!r})\n"
THROUGH_LITELLM = {"PLUGIN_LLM_OWN_PATH": "0"}
DEEPSEEK_KEY = {"DEEPSEEK_API_KEY": "sk-bench-coldstart-0000"}
#: name -> (code, extra environment)
OURS = {
    "allowed call (HTTP)": (HTTP_CALL, {}),
    "allowed acomplete (HTTP)": (ASYNC_CALL, {}),
    "HTTP call via litellm": (HTTP_CALL, THROUGH_LITELLM),
    "deepseek call (HTTP)": (DEEPSEEK_CALL, DEEPSEEK_KEY),
    "deepseek call via litellm": (DEEPSEEK_CALL, {**DEEPSEEK_KEY, **THROUGH_LITELLM}),
    "trust denial": ("from plugin_llm import PluginLlm, PluginLlmTrustError\n"
                     "try:\n    PluginLlm('bench', home={home!r}).complete({messages!r}, model='not-allowed')\n"
                     "except PluginLlmTrustError:\n    pass\n"
                     "else:\n    raise SystemExit('not denied')\n", {}),
    "local model call": (LOCAL_CALL, {}),
    "local call via litellm": (LOCAL_CALL, THROUGH_LITELLM),
    "python -c pass": ("pass\n", {}),
}
HERMES_FIRST = ("from agent.plugin_llm import PluginLlm\n"
                "assert PluginLlm(plugin_id='bench').complete({messages!r}).text\n")
DONE = "print('done', flush=True)\n"


def timed(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """(seconds to the 'done' line, peak RSS in MB) of one fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - t0
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if line.strip() != "done" or proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): {err[-1500:]}")
    return elapsed, usage.ru_maxrss / 1024


def homes(base_url: str, tmp: Path) -> dict[str, Path]:
    http, local, deepseek = tmp / "http", tmp / "local", tmp / "deepseek"
    for home in (http, local, deepseek):
        home.mkdir()
    (http / "config.yaml").write_text(f"model:\n  provider: custom\n  model: {MODEL}\n  base_url: {base_url}\n")
    (local / "config.yaml").write_text("model:\n  provider: local\n  model: local-echo-1\n")
    (deepseek / "config.yaml").write_text(f"model:\n  provider: deepseek\n  model: deepseek-chat\n"
                                          f"  base_url: {base_url}\n")
    return {"home": http, "local_home": local, "deepseek_home": deepseek}


def contenders(base_url: str, tmp: Path, hermes: Hermes) -> dict[str, tuple[list[str], dict[str, str], str]]:
    paths = homes(base_url, tmp)
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}
    ours_env = {**env, "PYTHONPATH": str(ROOT), "HOME": str(tmp / "user")}
    runs = {}
    for name, (code, extra) in OURS.items():
        source = code.format(messages=MESSAGES, **{name: str(path) for name, path in paths.items()}) + DONE
        runs[name] = ([sys.executable, "-c", source], {**ours_env, **extra}, str(ROOT))
    if not hermes.skipped:
        hermes_home = tmp / "hermes"
        (hermes_home / "user").mkdir(parents=True)
        (hermes_home / "config.yaml").write_text(
            f"model:\n  provider: custom\n  model: {MODEL}\n  base_url: {base_url}\n")
        hermes_env = {**env, "HERMES_HOME": str(hermes_home), "HOME": str(hermes_home / "user")}
        runs["Hermes first ctx.llm call"] = ([hermes.python, "-c", HERMES_FIRST.format(messages=MESSAGES) + DONE],
                                             hermes_env, str(hermes_home))
    return runs


def bench(runs: dict, rounds: int) -> dict[str, dict[str, list[float]]]:
    names = list(runs)
    samples = {name: {"s": [], "rss": []} for name in names}
    for _ in range(1):  # warm the page cache once, untimed
        for name in names:
            timed(*runs[name])
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            seconds, rss = timed(*runs[name])
            samples[name]["s"].append(seconds)
            samples[name]["rss"].append(rss)
    return samples


def report(samples: dict[str, dict[str, list[float]]], rounds: int) -> None:
    base = statistics.median(samples["python -c pass"]["s"])
    hermes = samples.get("Hermes first ctx.llm call")
    ref = statistics.median(hermes["s"]) if hermes else None
    print(f"\n== cold start: fresh processes, interleaved, {rounds} rounds: time to the first result "
          "(median, min-max) and peak RSS")
    head = f"{'contender':<28}{'median ms':>11}{'min-max ms':>17}{'x pass':>9}"
    head += f"{'x Hermes':>10}" if ref else ""
    print(head + f"{'peak RSS MB':>13}")
    for name, s in samples.items():
        med = statistics.median(s["s"])
        spread = f"{min(s['s']) * 1000:.0f}-{max(s['s']) * 1000:.0f}"
        row = f"{name:<28}{med * 1000:>11.0f}{spread:>17}{med / base:>9.2f}"
        if ref:
            row += f"{med / ref:>10.2f}"
        print(row + f"{statistics.median(s['rss']):>13.1f}")
    median = {name: statistics.median(s["s"]) for name, s in samples.items()}
    rss = {name: statistics.median(s["rss"]) for name, s in samples.items()}
    first, local = median["allowed call (HTTP)"], median["local model call"]
    deepseek = median["deepseek call (HTTP)"]
    print(f"\nfirst HTTP call: {first / median['HTTP call via litellm']:.2f}x the same call through litellm, "
          f"{first / base:.1f}x python -c pass; first deepseek call: "
          f"{deepseek / median['deepseek call via litellm']:.2f}x through litellm, peak RSS "
          f"{rss['deepseek call (HTTP)'] / rss['deepseek call via litellm']:.2f}x; local call: "
          f"{local / median['local call via litellm']:.2f}x through litellm")
    if ref:
        hermes_rss = statistics.median(hermes["rss"])
        for what, value, target in (
                ("a denial", median["trust denial"] / ref, 0.35), ("the first HTTP call", first / ref, 1.0),
                ("its peak RSS", rss["allowed call (HTTP)"] / hermes_rss, 1.2), ("a local call", local / ref, 0.5)):
            print(f"target: {what} <= {target}x Hermes's first call: {value:.2f}x "
                  f"({'met' if value <= target else 'NOT met'})")
    else:
        print("\n(no Hermes row: pass --hermes-python PATH or set HERMES_PYTHON)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--rounds", type=int, default=7, help=f"rounds (default 7, at most {MAX_ROUNDS})")
    parser.add_argument("--hermes-python", metavar="PATH", default=os.environ.get("HERMES_PYTHON"),
                        help="a Python with hermes-agent installed, for the Hermes first-call row")
    args = parser.parse_args()
    rounds = 3 if args.quick else max(1, min(args.rounds, MAX_ROUNDS))
    hermes = Hermes(args.hermes_python)
    if hermes.skipped:
        print(f"Hermes: skipped ({hermes.skipped})")
    with server_process() as server, tempfile.TemporaryDirectory(prefix="bench-coldstart-") as tmp:
        report(bench(contenders(server.base_url, Path(tmp), hermes), rounds), rounds)


if __name__ == "__main__":
    main()
