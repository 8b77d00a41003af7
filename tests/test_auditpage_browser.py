"""The auditor's page in a real headless browser: the distribution's Chromium driven by Playwright.

`plugin-llm audit serve` runs as a process over a real signed log; screenshots go to the test's
temporary directory.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from audit import AuditLog, AuditSettings, call_record
from audit.signing import generate_key, key_file, write_new_key
from tests.conftest import write_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
T0 = 1_772_323_200.0  # 2026-03-01T00:00:00Z
HOSTILE = "<script>window.__pwned=1</script><img src=x onerror=window.__pwned=2>"


def _clock(step: float):
    t = [T0 - step]

    def now() -> float:
        t[0] += step
        return t[0]

    return now


def fill(home: Path) -> Path:
    """alpha: 9 calls over three days, two refused by its budget; a plugin whose id is markup."""
    line, signer = generate_key()
    write_new_key(key_file(home), line, signer)
    log = AuditLog(home / "logs" / "agent.log", AuditSettings(checkpoint_every=5), clock=_clock(8 * 3600))
    for i in range(9):
        denied = i in (4, 7)
        record = call_record(
            call_id=f"a{i}", plugin_id="alpha", api="complete", mode="sync",
            decision="denied" if denied else "allowed", status="quota" if denied else "ok",
            decision_reason="budget_usd.day exceeded" if denied else None, request_model="gpt-4o-mini",
            input_tokens=None if denied else 100, output_tokens=None if denied else 20,
            cost_usd=None if denied else 0.05 * (i + 1), latency_ms=12.0, purpose=f"summarise batch {i}")
        if denied:
            record["decision_key"] = "plugins.entries.alpha.limits.budget_usd.day"
        log.write(record)
    log.write(call_record(call_id="h1", plugin_id=HOSTILE, api="complete", mode="sync", decision="allowed",
                          status="ok", request_model="gpt-4o-mini", cost_usd=0.01, purpose=HOSTILE))
    log.close()
    return home / "logs" / "agent.log"


def priced_days(home: Path) -> int:
    from audit.reader import iter_records

    return len({r["ts"][:10] for r in iter_records(home) if r.get("cost_usd")})


class PageServer:
    """`plugin-llm audit serve --port 0` as a process; its URL from the line it prints."""

    def __init__(self, home: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HERMES_HOME": str(home)}
        self.proc = subprocess.Popen([sys.executable, "-m", "plugin_llm", "audit", "serve", "--home", str(home),
                                      "--port", "0"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env,
                                     text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.proc.stderr], daemon=True).start()
        first = lines.get(timeout=60)  # a hang guard, not a timing assertion
        match = re.search(r"http://127\.0\.0\.1:\d+/", first)
        assert match, first
        self.url = match.group(0)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def page_server(hermes_home: Path):
    write_config(hermes_home, "plugins:\n  entries:\n    alpha:\n      limits:\n"
                              "        budget_usd: {day: 1.00, month: 20}\n")
    fill(hermes_home)
    server = PageServer(hermes_home)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"no Chromium at {CHROMIUM}: install the distribution's package (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def test_the_page_shows_spend_denials_a_record_and_a_broken_chain(page_server, browser, hermes_home, tmp_path):
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(page_server.url)
    # spend of the plugin that made calls: 0.05 * (1+2+3+4+6+7+9) from the log, and its budget from the store
    row = page.locator('#per-plugin tr[data-plugin="alpha"]')
    assert row.locator("td").nth(1).inner_text() == "9"
    assert row.locator("td").nth(2).inner_text() == "2"
    assert row.locator(".spend").inner_text() == "$1.600000"
    assert "day:" in row.inner_text() and "of $1.00" in row.inner_text()
    assert page.locator("#spend-per-day tbody tr").count() == priced_days(hermes_home) >= 3  # a row per UTC day
    page.wait_for_selector("#spend-chart[data-drawn] canvas", timeout=30_000)  # the chart (vendored uPlot)
    assert page.locator(".chain [data-chain=whole]").count() == 1
    page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)
    # markup in a plugin id and a purpose is text, never markup: shown literally, nothing ran
    assert HOSTILE in page.locator("#per-plugin").inner_text()
    assert page.evaluate("window.__pwned") is None and not dialogs

    # its denials: the denied count links to the filtered records
    row.locator("td").nth(2).locator("a").click()
    page.wait_for_url(re.compile(r".*/records\?plugin=alpha&decision=denied"))
    statuses = page.locator("#records tbody tr td:nth-child(3)").all_inner_texts()
    assert statuses == ["quota", "quota"]
    assert page.locator("select[name=decision]").input_value() == "denied"
    page.screenshot(path=str(tmp_path / "denials.png"), full_page=True)

    # one record's evidence: every field, the deciding rule and its config key
    page.locator("#records tbody tr").first.locator("a").click()
    evidence = page.locator("#evidence").inner_text()
    assert "plugins.entries.alpha.limits.budget_usd.day" in evidence and "summarise batch 7" in evidence
    assert "prev_hash" in evidence and page.locator("[data-chain=whole]").count() == 1
    page.screenshot(path=str(tmp_path / "record.png"), full_page=True)

    # the hostile plugin's own records list it as text too
    page.goto(page_server.url + "records")
    assert HOSTILE in page.locator("#records").inner_text()
    assert page.evaluate("window.__pwned") is None and not dialogs

    # an edited record: the chain shows as broken, on the overview and the chain page
    log = hermes_home / "logs" / "agent.log"
    log.write_bytes(log.read_bytes().replace(b"summarise batch 3", b"summarise batch X"))
    page.goto(page_server.url)
    assert page.locator(".chain [data-chain=broken]").count() == 1
    page.goto(page_server.url + "chain")
    assert "not whole: the first problem is at" in page.locator(".replica").inner_text()
    problems = page.locator(".problems").inner_text()
    assert "edited" in problems and "seq 4" in problems
    page.screenshot(path=str(tmp_path / "chain-broken.png"), full_page=True)


def test_the_page_works_with_javascript_off_except_the_chart(page_server, browser, hermes_home, tmp_path):
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.goto(page_server.url)
    assert page.locator('#per-plugin tr[data-plugin="alpha"] .spend').inner_text() == "$1.600000"
    assert page.locator("#spend-per-day tbody tr").count() == priced_days(hermes_home)  # the chart's numbers
    assert page.locator("#spend-chart canvas").count() == 0
    page.goto(page_server.url + "records")
    page.fill("input[name=plugin]", "alpha")
    page.select_option("select[name=decision]", "denied")
    page.click("form.filters button[type=submit]")
    assert page.locator("#records tbody tr").count() == 2
    page.screenshot(path=str(tmp_path / "no-js.png"), full_page=True)
    context.close()
