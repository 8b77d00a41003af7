"""plugin-llm limits show|reset, and limits in trust show / trust check."""

from __future__ import annotations

import json

import pytest

from plugin_llm import PluginLlm, PluginLlmQuotaError, limits
from plugin_llm.cli.main import main
from tests.conftest import audit_lines, write_config
from tests.redis_server import redis_server  # noqa: F401  (fixture)

CONFIG = ("limits:\n  store: local\nplugins:\n  enabled: [capped]\n  entries:\n    capped:\n      limits:\n"
          "        requests_per_minute: 2\n        budget_usd: {day: 1.0}\n")
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _fresh_stores():
    yield
    limits.close_stores()


def events(home) -> list[dict]:
    lines = (home / "logs" / "agent.log").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "event"]


def test_show_lists_each_limit_with_its_usage_and_reset_time(hermes_home, capsys):
    write_config(hermes_home, CONFIG)
    PluginLlm("capped").complete(USER)
    limits.close_stores()
    assert main(["limits", "show"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("capped: budget $1.00/day; 2 requests/min")
    assert "requests_per_minute" in out and "1 used, resets" in out and "budget_usd.day" in out
    assert main(["limits", "show", "capped", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["plugins"]
    assert row["plugin_id"] == "capped" and row["usage"]["minute"]["requests"] == 1


def test_reset_is_audited_first_and_lets_the_plugin_call_again(hermes_home, capsys):
    write_config(hermes_home, CONFIG)
    llm = PluginLlm("capped")
    llm.complete(USER)
    llm.complete(USER)
    with pytest.raises(PluginLlmQuotaError):
        llm.complete(USER)
    limits.close_stores()
    assert main(["limits", "reset", "capped"]) == 0
    assert "reset capped" in capsys.readouterr().out
    [event] = [e for e in events(hermes_home) if e["event"] == "limits.reset"]
    assert event["plugin_id"] == "capped" and event["forgotten.requests_this_minute"] == 2
    llm.complete(USER)  # the minute's requests were forgotten


def test_reset_and_show_refuse_what_makes_no_sense_in_one_line(hermes_home, capsys):
    write_config(hermes_home, CONFIG + "    unlimited: {}\n")  # a known plugin without limits
    assert main(["limits", "reset", "unlimited"]) == 2
    assert "has no limits" in capsys.readouterr().err
    write_config(hermes_home, "limits:\n  store: redis\n  redis_url: redis://127.0.0.1:1/0\n  store_timeout: 0.5\n"
                              "plugins:\n  entries:\n    capped:\n      limits: {requests_per_minute: 2}\n")
    assert main(["limits", "show"]) == 1
    captured = capsys.readouterr()
    assert "usage unknown" in captured.out and "Traceback" not in captured.err
    assert main(["limits", "reset", "capped"]) == 1
    assert "Connection refused; nothing was reset" in capsys.readouterr().err


def test_trust_show_and_check_report_limits(hermes_home, capsys):
    write_config(hermes_home, "model:\n  provider: custom\n  model: m\n  base_url: http://127.0.0.1:9/v1\n"
                              "plugins:\n  entries:\n    capped:\n      limits:\n        budget_usd: {day: 1.0}\n")
    main(["trust", "show"])
    out = capsys.readouterr().out
    assert "limits: budget $1.00/day" in out
    main(["trust", "show", "--json"])  # the same limits in the JSON
    by_id = {p["plugin_id"]: p for p in json.loads(capsys.readouterr().out)["plugins"]}
    assert by_id["capped"]["limits"]["budget_usd"] == {"day": 1.0, "month": None}
    main(["trust", "check"])
    out = capsys.readouterr().out
    assert 'limits.prices."custom/m"' in out  # a budget on an unpriced model refuses every call


def test_audit_stats_shows_spend_against_budget(hermes_home, capsys):
    from tests.servers import FakeServer

    with FakeServer() as server:
        write_config(hermes_home, f"model:\n  provider: custom\n  model: m\n  base_url: {server.base_url}\n"
                                  "limits:\n  prices:\n    custom/m: {input_per_mtok: 1.0, output_per_mtok: 2.0}\n"
                                  "plugins:\n  entries:\n    capped:\n      limits:\n        budget_usd: {day: 0.995}\n")
        PluginLlm("capped").complete(USER)
    limits.close_stores()
    assert main(["audit", "stats"]) == 0
    out = capsys.readouterr().out
    assert "spend against budget" in out and "capped  day" in out and "spent $0.000013" in out
    assert "of $0.995 (0%)" in out  # the budget as set, not rounded to $0.99 or $1.00
    assert main(["audit", "stats", "--json"]) == 0
    budgets = json.loads(capsys.readouterr().out)["budgets"]
    assert budgets["capped"]["day"]["spent_usd"] == pytest.approx(13e-6) and budgets["capped"]["day"]["budget_usd"] == 0.995


def test_the_read_only_views_create_no_store_in_the_home(hermes_home, capsys):
    write_config(hermes_home, CONFIG)
    assert main(["limits", "show"]) == 0 and "0 used" in capsys.readouterr().out
    from audit import AuditLog

    AuditLog(hermes_home / "logs" / "agent.log").write({"plugin_id": "capped", "status": "ok"})
    assert main(["audit", "stats"]) == 0 and "capped  day" in capsys.readouterr().out
    assert not (hermes_home / "limits.sqlite3").exists()


def test_audit_stats_budgets_say_why_they_are_missing_and_keep_one_shape(hermes_home, capsys):
    write_config(hermes_home, "limits:\n  store: redis\n  redis_url: redis://127.0.0.1:1/0\n  store_timeout: 0.3\n"
                              "plugins:\n  entries:\n    capped:\n      limits: {budget_usd: {day: 1.0}}\n")
    from audit import AuditLog

    AuditLog(hermes_home / "logs" / "agent.log").write({"plugin_id": "x" * 5000, "status": "ok"})
    assert main(["audit", "stats", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # a budgeted plugin without records is still shown; a store error is not a window
    assert doc["budgets"] == {} and "Connection refused" in doc["budget_errors"]["capped"]
    assert main(["audit", "stats"]) == 0
    out = capsys.readouterr().out
    assert "capped: unknown (" in out and max(map(len, out.splitlines())) < 400  # a 5,000-character id is cut
    with open(hermes_home / "config.yaml", "a") as f:
        f.write("  bad: [\n")  # config.yaml no longer parses: budgets unknown, and said so
    assert main(["audit", "stats", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["budgets"] == {} and "spend against budget not shown" in captured.err


def test_money_is_never_rounded_up_to_the_cap_and_a_broken_store_is_tried_once_per_view(tmp_path, monkeypatch):
    from plugin_llm.limits import views
    from plugin_llm.limits.local import LocalStore
    from plugin_llm.limits.settings import NANO, parse_limit_settings

    assert [views.usd_text(n) for n in (0, 999, 13_000, 84_000_000, 996_999_999, NANO, 1_234_567_890 * NANO // 1000)] \
        == ["$0.00", "<$0.000001", "$0.000013", "$0.084", "$0.996999", "$1.00", "$1,234,567.89"]
    settings, _ = parse_limit_settings({"store": "local"}, {"entries": {p: {"limits": {"max_concurrent": 1}}
                                                                        for p in ("a", "b", "c")}})
    tried = []

    def hung(self, plugin_id, *args, **kwargs):
        tried.append(plugin_id)
        raise limits.StoreError("the store hung")

    monkeypatch.setattr(LocalStore, "snapshot", hung)
    rows = views.show(settings, tmp_path, ["a", "b", "c"])
    assert tried == ["a"] and [r.error for r in rows] == ["the store hung"] * 3


_SPENDER = ("import threading, time\n\n"
            "def register(ctx):\n"
            "    def spend(raw):\n"
            "        threading.Thread(target=time.sleep, args=(60,), name='plugin-stray').start()\n"
            "        return ctx.llm.complete([{'role': 'user', 'content': 'hi'}], max_tokens=20).text\n"
            "    ctx.register_command('spend', spend)\n")


@pytest.mark.slow
def test_a_cli_call_that_ends_with_a_stray_thread_still_counts_its_usage(hermes_home):
    """The CLI ends with os._exit when a non-daemon thread is left (a plugin's, litellm's logging
    worker): the call's usage must reach the store all the same, and nothing stays in flight."""
    from tests.plugin_fixtures import write_plugin
    from tests.test_plugins_faults import _cli

    write_plugin(hermes_home / "plugins", "spender", _SPENDER)
    write_config(hermes_home, "limits:\n  prices:\n    local/local-echo-1: {input_per_mtok: 1000, output_per_mtok: 1000}\n"
                 "plugins:\n  enabled: [spender]\n  entries:\n    spender:\n      limits:\n"
                 "        budget_usd: {day: 5}\n        max_concurrent: 1\n")
    for _ in range(2):  # max_concurrent 1: the second call is refused if the first stays in flight
        ran = _cli(hermes_home, "run", "spend")
        assert ran.returncode == 0, ran.stderr
    settings = limits.parse_limit_settings(*_sections(hermes_home))[0]
    snap = limits.snapshot(settings, hermes_home, "spender")
    assert snap.counters.in_flight == 0
    cost = sum(r["cost_usd"] for r in audit_lines(hermes_home))
    assert cost > 0 and snap.counters.day_spent == round(cost * limits.NANO)
    assert snap.counters.day_reserved == 0


def _sections(home):
    import yaml

    data = yaml.safe_load((home / "config.yaml").read_text())
    return data.get("limits"), data.get("plugins")


# ------------------------------------------------------------------ a reset is on record, and reaches the store meant
def minute_requests(capsys) -> int:
    capsys.readouterr()
    assert main(["limits", "show", "capped", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["plugins"]
    return row["usage"]["minute"]["requests"]


def test_a_reset_the_audit_log_cannot_record_is_refused_even_when_the_log_is_not_required(hermes_home, capsys):
    write_config(hermes_home, CONFIG)
    PluginLlm("capped").complete(USER)
    limits.close_stores()
    (hermes_home / "logs" / "agent.log").unlink()
    (hermes_home / "logs" / "agent.log").mkdir()  # a log that cannot be appended to
    capsys.readouterr()
    assert main(["limits", "reset", "capped"]) == 1
    err = capsys.readouterr().err
    assert "cannot be written" in err and "nothing was reset" in err and "Traceback" not in err
    assert "whatever audit.required says" in err and "calls continue" not in err  # not the calls' advice
    assert "audit.required is true" not in err and err.count("\n") == 1
    assert minute_requests(capsys) == 1  # the counters are untouched


@pytest.mark.parametrize("section", [
    "  store: local\n  store_timout: 1\n",  # a typo: the limits section is broken
    "  store: redis\n  redis_url: redis://127.0.0.1:1/0\n  redis_key_prefix: 'group A'\n",  # a prefix that is not one
])
def test_a_reset_under_a_broken_limits_section_is_refused_and_resets_nothing(hermes_home, capsys, section):
    write_config(hermes_home, CONFIG)
    PluginLlm("capped").complete(USER)
    limits.close_stores()
    write_config(hermes_home, CONFIG.replace("  store: local\n", section))
    capsys.readouterr()
    assert main(["limits", "reset", "capped"]) == 1
    err = capsys.readouterr().err
    assert "nothing was reset" in err and "trust check" in err and "Traceback" not in err
    assert not [e for e in events(hermes_home) if e["event"].startswith("limits.reset")]
    write_config(hermes_home, CONFIG)
    assert minute_requests(capsys) == 1


def _clear_of_a_minute_end(margin: float = 15.0) -> None:
    """Start after the next minute's start when this one ends within ``margin`` seconds: the
    per-minute counters a test reads back then hold every call it made."""
    import time

    left = 60.0 - time.time() % 60.0
    if left < margin:
        time.sleep(left + 0.05)


def test_a_reset_records_its_request_then_what_the_store_deleted(hermes_home, capsys):
    _clear_of_a_minute_end()
    write_config(hermes_home, CONFIG)
    llm = PluginLlm("capped")
    llm.complete(USER)
    llm.complete(USER)
    limits.close_stores()
    assert main(["limits", "reset", "capped"]) == 0
    requested, done = [e for e in events(hermes_home) if e["event"].startswith("limits.reset")]
    assert requested["event"] == "limits.reset.requested" and done["event"] == "limits.reset"
    assert requested["plugin_id"] == done["plugin_id"] == "capped"
    assert requested["store_path"] == done["store_path"] == str(hermes_home / "limits.sqlite3")
    assert done["forgotten.requests_this_minute"] == 2 and done["seq"] == requested["seq"] + 1
    assert main(["limits", "reset", "capped"]) == 0  # again: nothing left, and it says so
    assert events(hermes_home)[-1]["forgotten.requests_this_minute"] == 0


def test_a_reset_the_store_refuses_is_recorded_as_failed_with_the_request(hermes_home, capsys, redis_server):
    import redis

    admin = redis.Redis.from_url(redis_server.url)
    admin.acl_setuser("nodel", enabled=True, passwords=["+nodel-canary-pw"], keys=["*"], channels=["*"],
                      commands=["+@all", "-del"])
    try:
        url = f"redis://nodel:nodel-canary-pw@127.0.0.1:{redis_server.port}/0"
        write_config(hermes_home, CONFIG.replace("  store: local\n", f"  store: redis\n  redis_url: '{url}'\n"
                                                 "  redis_key_prefix: resetfail\n"))
        PluginLlm("capped").complete(USER)
        limits.close_stores()
        capsys.readouterr()
        assert main(["limits", "reset", "capped"]) == 1
        err = capsys.readouterr().err
        assert "nothing was reset" in err and "nodel-canary-pw" not in err and "Traceback" not in err
        requested, failed = [e for e in events(hermes_home) if e["event"].startswith("limits.reset")]
        assert (requested["event"], failed["event"]) == ("limits.reset.requested", "limits.reset.failed")
        assert failed["redis_key_prefix"] == "resetfail" and failed["error"]
        assert "nodel-canary-pw" not in (hermes_home / "logs" / "agent.log").read_text()
        assert minute_requests(capsys) == 1
    finally:
        admin.acl_deluser("nodel")
        admin.close()
