"""The auditor's page as HTML: every value from the log escaped (:func:`e`), no template engine.

Plugin ids, purposes, reasons and error texts are attacker-influenced: each goes through
:func:`e` (invisible and control characters shown as escapes, then HTML-escaped, bounded).
"""

from __future__ import annotations

import json
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from audit.records import DECISIONS, STATUSES
from plugin_llm.hardened.terminal_text import escape_unsafe, escape_unsafe_text

__all__ = ["e", "layout", "overview_page", "records_page", "record_page", "chain_page", "login_page", "error_page"]

_MAX_TEXT = 2000
_MAX_PROBLEMS = 100


def e(value: Any, limit: int | None = _MAX_TEXT) -> str:
    """Any value as HTML text: invisible and control characters made visible, then escaped (quotes too)."""
    if value is None:
        return "-"
    return escape(escape_unsafe(value if isinstance(value, str) else _json(value), limit), quote=True)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _usd(value: Any) -> str:
    return f"${value:.6f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _link(base: str, path: str, **query: Any) -> str:
    params = {k: v for k, v in query.items() if v not in (None, "")}
    return e(base + path + ("?" + urlencode(params) if params else ""))


def layout(base: str, title: str, body: str, *, scripts: bool = False) -> str:
    head_scripts = (f'<link rel="stylesheet" href="{e(base)}/static/uPlot.min.css">'
                    f'<script src="{e(base)}/static/uPlot.iife.min.js" defer></script>'
                    f'<script src="{e(base)}/static/page.js" defer></script>') if scripts else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(title)} - plugin-llm audit</title>
<link rel="stylesheet" href="{e(base)}/static/page.css">{head_scripts}</head>
<body><header><strong>plugin-llm audit</strong>
<nav><a href="{e(base)}/">Overview</a> <a href="{e(base)}/records">Records</a> <a href="{e(base)}/chain">Chain</a></nav>
<span class="ro">read-only</span></header>
<main><h1>{e(title)}</h1>
{body}
</main></body></html>"""


def _badge(state: Any) -> str:
    if state.error is not None:
        return f'<span class="badge warn">{e(state.error)}</span>'
    result = state.result
    if not result.ok:
        count = len(result.problems) + result.more
        return f'<span class="badge bad" data-chain="broken">BROKEN ({count} problem{"s" if count != 1 else ""})</span>'
    cps = result.checkpoints
    signed = cps is not None and cps.checked and cps.valid
    return ('<span class="badge ok" data-chain="whole">WHOLE' + (", signed" if signed else ", not signed") + "</span>")


def chain_summary(base: str, states: list[Any]) -> str:
    items = "".join(
        f'<li>{e(s.replica.name)}: {_badge(s)} '
        f'{"" if s.result is None or s.result.head_seq is None else f"up to seq {s.result.head_seq}"}'
        f' <a href="{e(base)}/chain">details</a></li>'
        for s in states)
    return f'<section class="chain"><h2>Chain</h2><ul>{items}</ul></section>'


def _meter(window: str, w: dict[str, Any]) -> str:
    share = w.get("used_fraction")
    pct = "-" if share is None else f"{share:.0%}"
    value = 0.0 if share is None else min(max(float(share), 0.0), 1.0)
    return (f'<div class="budget">{e(window)}: {_usd(w.get("spent_usd"))} spent + {_usd(w.get("in_flight_usd"))} '
            f'in flight of {_usd(w.get("budget_usd"))} ({e(pct)}) '
            f'<meter min="0" max="1" low="0.7" high="0.9" optimum="0" value="{value:.4f}">{e(pct)}</meter> '
            f'<small>resets {e(w.get("resets_at"))}</small></div>')


def overview_page(base: str, view: Any, series: dict[str, Any], states: list[Any], several: bool) -> str:
    parts = [chain_summary(base, states)]
    if several:
        parts.append('<section><h2>Calls per replica</h2><table id="per-replica"><tbody>' + "".join(
            f'<tr><td><a href="{_link(base, "/records", replica=name)}">{e(name, 100)}</a></td><td class="n">{count}</td></tr>'
            for name, count in view.per_replica.items()) + "</tbody></table></section>")
    rows = []
    for r in view.rows:
        budget = view.budgets.get(r.key)
        if r.key in view.budget_errors:
            cell = f"unknown ({e(view.budget_errors[r.key], 300)})"
        elif budget:
            cell = "".join(_meter(window, w) for window, w in budget.items())
        else:
            cell = "no budget"
        rows.append(
            f'<tr data-plugin="{e(r.key, 300)}"><td><a href="{_link(base, "/records", plugin=r.key)}">{e(r.key, 300)}</a></td>'
            f'<td class="n">{r.calls}</td>'
            f'<td class="n"><a href="{_link(base, "/records", plugin=r.key, decision="denied")}">{r.denials}</a></td>'
            f'<td class="n">{r.errors}</td><td class="n spend">{_usd(r.cost_usd)}</td><td>{cell}</td></tr>')
    note = f'<p class="note">{e(view.budget_note, 500)}</p>' if view.budget_note else ""
    parts.append(
        '<section><h2>Spend, calls and denials per plugin</h2>' + note +
        '<table id="per-plugin"><thead><tr><th>Plugin</th><th>Calls</th><th>Denied</th><th>Errors</th>'
        '<th>Spend (log)</th><th>Budget (limits store, current windows)</th></tr></thead><tbody>'
        + ("".join(rows) or '<tr><td colspan="6">no call records</td></tr>') + "</tbody></table></section>")
    # the chart (JavaScript) and the same numbers as a table (no JavaScript needed)
    data = json.dumps(series, ensure_ascii=True).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    plugins = [s["plugin"] for s in series["series"]]
    day_rows = "".join(
        f"<tr><td>{e(day)}</td>" + "".join(f'<td class="n">{_usd(spend.get(p, 0.0))}</td>' for p in plugins) + "</tr>"
        for day, spend in reversed(list(view.daily.items())))
    parts.append(
        '<section><h2>Spend per day (USD, UTC days)</h2>'
        '<div id="spend-chart" aria-hidden="true"></div>'
        f'<script type="application/json" id="spend-data">{data}</script>'
        '<details open><summary>The numbers</summary><table id="spend-per-day"><thead><tr><th>Day</th>'
        + "".join(f"<th>{e(p, 300)}</th>" for p in plugins) + "</tr></thead><tbody>"
        + (day_rows or '<tr><td>no priced calls</td></tr>') + "</tbody></table></details></section>")
    denial_rows = "".join(
        f'<tr><td><a href="{_link(base, "/records", plugin=p, decision="denied")}">{e(p, 300)}</a></td>'
        f"<td>{e(rule, 300)}</td><td><code>{e(key, 300)}</code></td><td class=\"n\">{n}</td></tr>"
        for p, rule, key, n in view.denials)
    parts.append(
        '<section><h2>Denials by rule</h2><table id="denials"><thead><tr><th>Plugin</th><th>Deciding rule</th>'
        '<th>Config key</th><th>Count</th></tr></thead><tbody>'
        + (denial_rows or '<tr><td colspan="4">no denials</td></tr>') + "</tbody></table></section>")
    if view.bad_lines:
        parts.append(f'<p class="note">{view.bad_lines} unreadable line(s) skipped: see <a href="{e(base)}/chain">Chain</a>.</p>')
    return layout(base, "Overview", "\n".join(parts), scripts=True)


def _options(values: tuple[str, ...] | list[str], chosen: str | None) -> str:
    return '<option value="">any</option>' + "".join(
        f'<option value="{e(v)}"{" selected" if v == chosen else ""}>{e(v)}</option>' for v in values)


def records_page(base: str, records: list[dict[str, Any]], more: bool, page: int, form: dict[str, str],
                 replicas: list[str], error: str | None) -> str:
    several = len(replicas) > 1
    replica_field = (f'<label>Replica <select name="replica">{_options(replicas, form.get("replica"))}</select></label>'
                     if several else "")
    body = [
        f'<form method="get" action="{e(base)}/records" class="filters">'
        f'<label>Plugin <input name="plugin" value="{e(form.get("plugin", ""), 300)}" maxlength="256"></label>'
        f'<label>Status <select name="status">{_options(STATUSES, form.get("status"))}</select></label>'
        f'<label>Decision <select name="decision">{_options(DECISIONS, form.get("decision"))}</select></label>'
        f'<label>Since <input name="since" value="{e(form.get("since", ""), 100)}" placeholder="2026-03-01 or 1h" maxlength="64"></label>'
        f'<label>Until <input name="until" value="{e(form.get("until", ""), 100)}" placeholder="now" maxlength="64"></label>'
        f'{replica_field}<button type="submit">Filter</button> <a href="{e(base)}/records">clear</a></form>']
    if error:
        body.append(f'<p class="error" role="alert">{e(error, 500)}</p>')
    head = ("<th>Replica</th>" if several else "") + (
        "<th>Time (UTC)</th><th>Plugin</th><th>Status</th><th>Decision</th><th>Rule</th><th>Model</th>"
        "<th>Tokens in/out</th><th>Cost</th><th>Purpose</th><th>Seq</th>")
    rows = []
    for r in records:
        model = r.get("gen_ai.response.model") or r.get("gen_ai.request.model")
        seq = r.get("seq")
        link = _link(base, f"/record/{quote(str(r.get('replica', '')), safe='')}/{seq}") if isinstance(seq, int) else ""
        rows.append(
            f'<tr class="status-{e(r.get("status"), 40)}">' + (f"<td>{e(r.get('replica'), 100)}</td>" if several else "")
            + f"<td>{e(r.get('ts'), 40)}</td><td>{e(r.get('plugin_id'), 300)}</td><td>{e(r.get('status'), 40)}</td>"
            f"<td>{e(r.get('decision'), 40)}</td><td>{e(r.get('decision_reason'), 200)}</td><td>{e(model, 200)}</td>"
            f"<td class=\"n\">{e(r.get('gen_ai.usage.input_tokens'), 20)}/{e(r.get('gen_ai.usage.output_tokens'), 20)}</td>"
            f"<td class=\"n\">{_usd(r.get('cost_usd'))}</td><td>{e(r.get('purpose'), 300)}</td>"
            + (f'<td><a href="{link}">{seq}</a></td>' if link else "<td>-</td>") + "</tr>")
    body.append(f'<table id="records"><thead><tr>{head}</tr></thead><tbody>'
                + ("".join(rows) or '<tr><td colspan="11">no records match</td></tr>') + "</tbody></table>")
    nav = []
    query = {k: v for k, v in form.items() if v}
    if page > 1:
        nav.append(f'<a href="{_link(base, "/records", **query, page=page - 1)}">newer</a>')
    if more:
        nav.append(f'<a href="{_link(base, "/records", **query, page=page + 1)}">older</a>')
    body.append(f'<p class="pages">page {page} (newest first) {" ".join(nav)}</p>')
    return layout(base, "Records", "\n".join(body))


def record_page(base: str, record: dict[str, Any], state: Any) -> str:
    rows = "".join(f"<tr><th>{e(k, 200)}</th><td><code>{e(v, 20000)}</code></td></tr>" for k, v in record.items())
    whole = json.dumps(record, ensure_ascii=False, indent=2, default=str)
    seq = record.get("seq")
    cps = state.result.checkpoints if state.result is not None else None
    if cps is not None and cps.checked and isinstance(cps.covered_seq, int) and isinstance(seq, int):
        signed = (f"covered by the signed checkpoint of seq {cps.last_seq} (key id {e(', '.join(cps.keys))})"
                  if seq <= cps.covered_seq else "newer than the last signed checkpoint: not covered by a signature yet")
    else:
        signed = "no signed checkpoint checked"
    body = (f"<p>Replica {e(record.get('replica'))}, seq {e(seq)}; its chain: {_badge(state)}; "
            f'<span id="signature">{signed}</span></p>'
            f'<table id="evidence">{rows}</table><h2>As written</h2><pre>{escape(escape_unsafe_text(whole[:200000]))}</pre>')
    return layout(base, f"Record {record.get('seq')}", body)


def chain_page(base: str, states: list[Any]) -> str:
    parts = []
    for s in states:
        items = [f"<dt>Log</dt><dd><code>{e(str(s.replica.log))}</code></dd>",
                 f"<dt>Public keys</dt><dd>{e(s.pubkey or 'none (the signatures are not checked)')}</dd>",
                 f"<dt>State</dt><dd>{_badge(s)}</dd>"]
        r = s.result
        if r is not None:
            items.append(f"<dt>Records</dt><dd>{r.records} in {len(r.files)} file(s)</dd>")
            if r.ok and r.head_seq is not None:
                items.append(f"<dt>Verified up to</dt><dd>seq {r.head_seq} (head hash <code>{e(r.head_hash)}</code>)</dd>")
            elif r.first_error is not None:
                first = r.first_error
                items.append(f"<dt>Verified up to</dt><dd>not whole: the first problem is at "
                             f"<code>{e(first.file)}:{first.line}</code></dd>")
            cps = r.checkpoints
            if cps is not None and cps.checked and cps.last_seq is not None:
                items.append(f"<dt>Last signed checkpoint</dt><dd>seq {cps.last_seq} at {e(cps.last_time)}, "
                             f"key id {e(', '.join(cps.keys))}; records 1..{e(cps.covered_seq)} covered by a "
                             f"signature; {cps.valid} valid checkpoint(s)</dd>")
            elif cps is not None and cps.present:
                items.append("<dt>Checkpoints</dt><dd>present, not checked (no public keys)</dd>")
            else:
                items.append("<dt>Checkpoints</dt><dd>none (no signing key)</dd>")
            problems = "".join(f"<li><code>{e(p.kind)}</code> {e(p.file)}:{p.line}: {e(p.detail)}</li>"
                               for p in r.problems[:_MAX_PROBLEMS])
            more = len(r.problems) - _MAX_PROBLEMS + r.more
            if problems:
                items.append(f'<dt>Problems</dt><dd><ul class="problems">{problems}</ul>'
                             + (f"<p>{more} more (run <code>plugin-llm audit verify</code>)</p>" if more > 0 else "")
                             + "</dd>")
            warnings = "".join(f"<li><code>{e(w.kind)}</code> {e(w.detail)}</li>" for w in r.warnings[:_MAX_PROBLEMS])
            if warnings:
                items.append(f"<dt>Warnings</dt><dd><ul>{warnings}</ul></dd>")
        parts.append(f'<section class="replica"><h2>{e(s.replica.name)}</h2><dl>{"".join(items)}</dl></section>')
    return layout(base, "Chain", "\n".join(parts))


def login_page(base: str, failed: bool) -> str:
    error = '<p class="error" role="alert">That is not the admin token.</p>' if failed else ""
    body = (f"{error}<form method=\"post\" action=\"{e(base)}/login\"><label>Admin token "
            f'<input type="password" name="token" autocomplete="off" maxlength="512" required></label> '
            f'<button type="submit">Open</button></form>'
            "<p>The audit page needs the admin token ($PLUGIN_LLM_ADMIN_TOKEN of the service), never a plugin's.</p>")
    return layout(base, "Sign in", body)


def error_page(base: str, title: str, message: str) -> str:
    return layout(base, title, f'<p class="error">{e(message, 500)}</p>')
