"""The web console's one page: plain HTML, CSS and a small vanilla script.

Nothing is loaded from elsewhere (no CDN, no build step): the page fetches
the app's JSON views and listens to ``/api/events`` (server-sent events),
refetching the view it shows when an event of interest arrives. Views, by
the URL's fragment: ``#/?status=&q=&plan=&agent=&since=&until=&offset=`` the
runs, filtered and paged; ``#/run/ID?show=&offset=`` a run: its actions
(cancel, download the HTML replay), the dependency graph and the Gantt of
attempts of one page of its tasks (the Gantt is ``replay --html``'s own
renderer, :data:`~cardbus.projections.replay_html.GANTT_JS`, over the same
replay projection), the task table with each task's events fetched when
opened; ``#/task/ID`` a task's steps, its inputs as planned beside the inputs
its agent received, and its model calls (prompt and answer expandable), tool
calls and unknown effects by attempt, each marked live or replayed;
``#/diff/A/B`` two runs compared (``cardbus diff``): the first divergence and
each task side by side. The run-making actions (``tools.ui.actions``) have
forms of their own outside the view, drawn when the route changes and kept
across the live view's re-renders: "Start a run" (a goal, a pasted plan or a
plan file) above the runs, "Re-run this task" and "Fork the run from this task"
(fork point, model, inputs to override) on a task's page; disabled, with the
line saying how to enable them, when ``/api/console`` says the console runs no
agents. Costs are in USD ("unknown price" for a model the
price table has none for, "at least" a sum with such a part). Running
and waiting durations tick every second. Elements carry ``data-*`` attributes
(status, ids) for tests and scripts.
"""

from __future__ import annotations

# ruff: noqa: E501, RUF001 - the page's lines are HTML and JS, kept as written
from cardbus.projections.replay_html import GANTT_JS, gantt_css, legends

__all__ = ["PAGE"]

_CSS = """
  body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
  header { background: #1d2330; color: #fff; padding: 8px 16px; display: flex; gap: 16px;
           align-items: baseline; }
  header a { color: #fff; text-decoration: none; font-weight: 600; }
  header label { margin-left: auto; font-size: 12px; color: #9aa4b5; }
  header input { width: 8em; font-size: 12px; }
  #live { font-size: 12px; color: #9aa4b5; }
  #live.on { color: #7ee2a8; }
  main { padding: 12px 16px; }
  table { border-collapse: collapse; width: 100%; background: #fff; }
  th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #e3e6eb;
           vertical-align: top; }
  th { background: #eef0f4; font-weight: 600; }
  .id, code, pre { font-family: ui-monospace, monospace; font-size: 12px; }
  td .id, td.id { white-space: nowrap; }
  pre { white-space: pre-wrap; overflow-wrap: anywhere; background: #f0f2f5; padding: 6px;
        margin: 4px 0; max-height: 30em; overflow: auto; }
  .nowrap { white-space: nowrap; }
  /* a ticking duration keeps its width: the page does not shift every second */
  .tick-since { display: inline-block; min-width: 10.5em; font-variant-numeric: tabular-nums;
                white-space: nowrap; }
  .st { font-weight: 600; }
  .s-completed { color: #17803d; } .s-failed { color: #c62828; } .s-halted { color: #8e24aa; }
  .s-timed_out { color: #e65100; } .s-cancelled { color: #777; }
  .s-running, .s-dispatched { color: #0277bd; }
  .s-awaiting_approval, .s-pending { color: #b26a00; }
  .s-needs_revision, .s-needs_input { color: #6a1b9a; }
  .muted { color: #6b7380; }
  .reason { color: #a33; }
  button { font: inherit; padding: 2px 10px; margin-right: 6px; cursor: pointer; }
  button.approve { background: #e3f5e9; border: 1px solid #17803d; }
  .invalid { outline: 2px solid #b00020; }
  form.question label { display: inline-block; min-width: 8em; font-weight: 600; }
  button.deny { background: #fdeaea; border: 1px solid #c62828; }
  .cost.unknown { color: #b26a00; }
  tr.differs td.differs { color: #c62828; font-weight: 600; }
  .tab.on { background: #1d2330; color: #fff; }
  .filters { display: flex; flex-wrap: wrap; gap: 6px; align-items: center; margin-bottom: 6px; }
  .pager { margin: 6px 0; } .pager span { margin-right: 6px; }
  .io { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
  h2 { font-size: 16px; margin: 16px 0 6px; }
  #error { color: #c62828; }
  details summary { cursor: pointer; color: #345; }
  .replayed { color: #8a6d00; } .live { color: #17803d; }
  tr.call-attempt th { background: #f6f7f9; }
  .graph-wrap { overflow-x: auto; background: #fff; border: 1px solid #e3e6eb; }
  #graph .edge { stroke: #8c96a5; stroke-width: 1.2; } #graph .edge.sub { stroke-dasharray: 3 3; }
  #graph text { font: 11px ui-monospace, monospace; fill: #fff; pointer-events: none; }
  #graph text.ext { fill: #6b7380; font-size: 10px; }
  #graph rect { stroke: #1d2330; stroke-opacity: .2; }
  .cb-gantt { --line: #e3e7ec; --muted: #66707c; background: #fff; font-size: 13px; }
  .cb-gantt #gantt { max-width: 100%; overflow-x: auto; }
  .ops { background: #fff; border: 1px solid #e3e6eb; padding: 6px 10px; margin: 6px 0; }
  .ops form { margin: 4px 0; } .ops label { margin-right: 8px; }
  .ops textarea { font: 12px ui-monospace, monospace; width: 100%; max-width: 60em; }
  #ops-result[data-outcome="error"] { color: #c62828; }
"""

PAGE = (
    """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>cardbus console</title>
<style>"""
    + _CSS
    + gantt_css(".cb-gantt")
    + gantt_css("#graph")
    + """</style>
</head>
<body data-live="no" data-view="">
<header><a href="#/">cardbus console</a><span id="live">connecting…</span>
<span id="you" title="the name your actions are logged with: your token's"></span>
<label>signed <input id="operator" value="" placeholder="your name (a note)" title="kept as a note on your actions; their actor is your token's name"></label>
</header>
<main>
<div id="error"></div>
<div id="ops"></div>
<section id="streaming" hidden><p class="stream-head"><b>Writing now</b></p><div id="streams"></div></section>
<div id="view"></div>
</main>
<script>
"""
    + GANTT_JS
    + "const LEGENDS = "
    + repr(legends()).replace("</", "<\\/")
    + ";\n"
    + r""""use strict";
const token = new URLSearchParams(location.search).get("token");
const esc = (v) => String(v === null || v === undefined ? "" : v).replace(/[&<>"']/g,
  (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
function url(path, params) {
  const u = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params || {})) if (v !== null && v !== undefined && v !== "") u.searchParams.set(k, v);
  if (token) u.searchParams.set("token", token);
  return u.pathname + u.search;
}
async function getJSON(path, params) {
  const r = await fetch(url(path, params));
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}
async function postJSON(path, body) {
  const r = await fetch(url(path), {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify(body)});
  const out = await r.json();
  if (!r.ok) { const e = new Error(out.error || r.statusText); e.field = out.field; throw e; }
  return out;
}
function fmtTime(t) { return t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : ""; }
function fmtDur(s) {
  if (s === null || s === undefined) return "";
  if (s < 1) return Math.round(s * 1000) + " ms";
  if (s < 120) return s.toFixed(2) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
// a degraded completion names the optional tasks it did without
const degraded = (r) => (r.degraded && r.degraded.length ? esc(` (without ${r.degraded.join(", ")})`) : "");
const status = (s) => `<span class="st s-${esc(s)}">${esc(s || "?")}</span>`;
const json = (v) => `<pre>${esc(JSON.stringify(v, null, 2))}</pre>`;
// a cost from the API ({usd, complete, text}): "unknown price" and "at least" as the CLI says
const cost = (c) => `<span class="cost ${c && c.complete ? "" : "unknown"}" data-usd="${c && c.usd !== null ? c.usd : ""}" data-complete="${c && c.complete ? "yes" : "no"}">${esc(c ? c.text : "unknown price")}</span>`;
const idLink = (kind, id) => `<a class="id" title="${esc(id)}" href="#/${kind}/${encodeURIComponent(id)}">${esc(id)}</a>`;
const RUNNING = ["running", "dispatched"], WAITING = ["pending", "awaiting_approval", "needs_input", "needs_revision"];
// the server's clock: durations tick from it (skew-free), every second
let skew = 0;
const now = () => Date.now() / 1000 + skew;
// a live duration: "<elapsed> so far" since a time, re-drawn every second
const since = (t, label) => `<span class="tick-since" data-since="${t}" data-label="${esc(label || "so far")}">${fmtDur(now() - t)} ${esc(label || "so far")}</span>`;
function tick() {
  for (const e of document.querySelectorAll("[data-since]")) {
    e.textContent = fmtDur(now() - Number(e.dataset.since)) + " " + e.dataset.label;
  }
}
setInterval(tick, 1000);
const actionResult = {};  // a run's last action's outcome, kept across re-renders
const operator = () => (document.getElementById("operator").value || "").trim();

// -- actions: approve / deny with a note, cancel a run -----------------------------------
function approvalButtons(taskId) {
  return `<span class="approval"><input class="note" data-note="${esc(taskId)}" placeholder="note (optional)">` +
    `<button class="approve" data-approve="${esc(taskId)}">Approve</button>` +
    `<button class="deny" data-deny="${esc(taskId)}">Deny</button></span>`;
}
// -- a question an agent asked a person: a form drawn from the answer's schema -------------
// each field keeps what was typed across re-renders (data-note), and the server checks
// the answer: a field the schema refuses is named in the error, the question stays open
function questionField(q, name, spec, value, required) {
  const key = `q:${q.task_id}:${name}`;
  const label = `<label for="${esc(key)}">${esc(name)}${required ? " *" : ""}</label>`;
  const enumv = spec.enum || (name === "" && q.choices) || null;
  const at = `id="${esc(key)}" data-note="${esc(key)}" data-field="${esc(name)}" data-kind="${esc(enumv ? "enum" : spec.type || "json")}"`;
  if (enumv) {
    const opts = enumv.map((v) => `<option value="${esc(JSON.stringify(v))}" ${JSON.stringify(v) === JSON.stringify(value) ? "selected" : ""}>${esc(String(v))}</option>`).join("");
    return `<p>${label} <select ${at}><option value=""></option>${opts}</select></p>`;
  }
  if (spec.type === "boolean") return `<p>${label} <input type="checkbox" ${at} ${value ? "checked" : ""}></p>`;
  if (["number", "integer", "string"].includes(spec.type)) {
    return `<p>${label} <input ${at} value="${esc(value === undefined || value === null ? "" : String(value))}"></p>`;
  }
  return `<p>${label} <textarea rows="3" ${at} placeholder="JSON">${esc(value === undefined ? "" : JSON.stringify(value))}</textarea></p>`;
}
function questionForm(q) {
  const s = q.schema || {}, props = s.properties, required = s.required || [];
  const dflt = q.default;
  const fields = props && typeof props === "object"
    ? Object.entries(props).map(([n, spec]) => questionField(q, n, spec || {}, dflt ? dflt[n] : undefined, required.includes(n))).join("")
    : questionField(q, "", s, dflt, true);
  return `<form class="question" data-question="${esc(q.task_id)}" onsubmit="return false">
    <h2>Question</h2><p id="question-text">${esc(q.question)}</p>${fields}
    <p class="reason" id="answer-error"></p>
    <button class="approve" data-answer="${esc(q.task_id)}">Answer</button>
    ${"default" in q ? `<button data-answer-default="${esc(q.task_id)}">Answer with the default</button>` : ""}
    <button class="deny" data-deny="${esc(q.task_id)}">Decline</button></form>`;
}
function answerFrom(form) {
  const read = (el) => {
    const v = el.type === "checkbox" ? el.checked : el.value;
    if (el.type === "checkbox") return v;
    if (el.dataset.kind === "enum") return v === "" ? undefined : JSON.parse(v);
    if (v === "") return undefined;
    if (el.dataset.kind === "number" || el.dataset.kind === "integer") {
      const n = Number(v.trim());  // not a number: sent as typed, for the server to refuse
      return v.trim() !== "" && !Number.isNaN(n) ? n : v;
    }
    if (el.dataset.kind === "string") return v;
    try { return JSON.parse(v); } catch (_) { return v; }
  };
  const els = [...form.querySelectorAll("[data-field]")];
  if (els.length === 1 && els[0].dataset.field === "") return read(els[0]);
  const out = {};
  for (const el of els) { const v = read(el); if (v !== undefined) out[el.dataset.field] = v; }
  return out;
}
function sendAnswer(t, body) {
  t.disabled = true;
  const form = t.closest("form"), err = document.getElementById("answer-error");
  postJSON(`/api/tasks/${encodeURIComponent(t.dataset.answer || t.dataset.answerDefault)}/answer`, body)
    .then(refresh)
    .catch((e) => {
      t.disabled = false;
      if (err) err.textContent = String(e.message || e);
      for (const el of form.querySelectorAll("[data-field]")) el.classList.toggle("invalid", !!e.field && el.dataset.field === e.field);
    });
}
document.addEventListener("click", (e) => {
  const t = e.target;
  if (!(t instanceof HTMLElement)) return;
  if (t.dataset.answer) { sendAnswer(t, {answer: answerFrom(t.closest("form"))}); return; }
  if (t.dataset.answerDefault) { sendAnswer(t, {default: true}); return; }
  const id = t.dataset.approve || t.dataset.deny;
  if (id) {
    t.disabled = true;
    const note = document.querySelector(`input[data-note="${CSS.escape(id)}"]`);
    postJSON(`/api/tasks/${encodeURIComponent(id)}/${t.dataset.approve ? "approve" : "deny"}`,
      {by: operator(), note: note ? note.value : ""}).then(refresh).catch(showError);
    return;
  }
  if (t.dataset.cancel) {
    t.disabled = true;
    const note = document.getElementById("cancel-note");
    postJSON(`/api/runs/${encodeURIComponent(t.dataset.cancel)}/cancel`, {by: operator(), note: note ? note.value : ""})
      .then((r) => { actionResult[r.root_id] = `cancelled ${r.cancelled.length} task(s) as ${r.by}`; refresh(); })
      .catch(showError);
    return;
  }
  if (t.dataset.page !== undefined) { go({offset: t.dataset.page}); return; }
  if (t.dataset.show) { go({show: t.dataset.show, offset: 0}); return; }
});
document.addEventListener("toggle", (e) => {  // a task's events, fetched when first opened
  const d = e.target;
  if (!(d instanceof HTMLDetailsElement) || !d.open || !d.dataset.events || d.dataset.loaded) return;
  d.dataset.loaded = "yes";
  getJSON(`/api/tasks/${encodeURIComponent(d.dataset.events)}`).then((data) => {
    d.querySelector("div").innerHTML = stepsTable(data.steps, "");
  }).catch(showError);
}, true);

// -- run-making actions: start a run (goal or plan), fork from a task, re-run a task ------
// Their forms live outside #view, drawn when the route (or the task's status) changes and
// kept across the live view's re-renders, so what the operator types is never wiped.
let consoleInfo = {enabled: false, how: "", agents: []};
let opsKey = null;
const dis = () => consoleInfo.enabled ? "" : "disabled";
const howLine = () => consoleInfo.enabled ? "" : `<p class="muted" id="ops-how">${esc(consoleInfo.how)}</p>`;
const FINISHED_BAD = ["failed", "halted", "cancelled"];
function startPanel() {
  return `<details class="ops" id="start-run" open data-enabled="${consoleInfo.enabled ? "yes" : "no"}"><summary>Start a run</summary>${howLine()}
    <form id="start-goal" class="filters"><input name="goal" id="goal" size="60" placeholder="a goal, e.g. a short report on ocean tides" ${dis()}>
      <button type="submit" id="start-goal-button" ${dis()}>Start from goal</button></form>
    <form id="start-plan"><textarea id="plan-text" name="plan" rows="5" placeholder='or a plan (JSON): {"goal": "...", "tasks": [...]}' ${dis()}></textarea><br>
      <label>or a plan file <input type="file" id="plan-file" accept=".json,application/json" ${dis()}></label>
      <button type="submit" id="start-plan-button" ${dis()}>Start plan</button></form>
    <p id="ops-result" class="muted"></p></details>`;
}
function taskPanel(k) {
  const rerun = FINISHED_BAD.includes(k.status) ? `<details open id="rerun-panel"><summary>Re-run this task</summary>
    <form id="rerun" data-task="${esc(k.task_id)}"><span class="muted">a new run: this task and what depends on it run again, the other results are reused</span><br>
      <label>model <input name="model" id="rerun-model" placeholder="(as recorded)" ${dis()}></label>
      <button type="submit" id="rerun-button" ${dis()}>Re-run</button></form></details>` : "";
  return `<div class="ops" id="task-ops" data-enabled="${consoleInfo.enabled ? "yes" : "no"}">${howLine()}${rerun}
    <details id="fork-panel"><summary>Fork the run from this task</summary>
    <form id="fork" data-task="${esc(k.task_id)}"><span class="muted">a new run: what completed before the fork point is reused, this task and the rest run again</span><br>
      <label>fork point <input name="at" id="fork-at" size="40" placeholder="before this task's result, or an event id / position" ${dis()}></label>
      <label>model <input name="model" id="fork-model" placeholder="(unchanged)" ${dis()}></label><br>
      <label>inputs (edit to override)<br><textarea name="inputs" id="fork-inputs" rows="5" data-original="${esc(JSON.stringify(k.input))}" ${dis()}>${esc(JSON.stringify(k.input, null, 2))}</textarea></label><br>
      <button type="submit" id="fork-button" ${dis()}>Fork</button></form></details>
    <p id="ops-result" class="muted"></p></div>`;
}
function renderOps(r, d) {
  const key = r.view === "runs" ? "runs" : r.view === "task" ? `task:${d.task.task_id}:${FINISHED_BAD.includes(d.task.status)}` : r.view;
  if (key === opsKey) return;
  opsKey = key;
  document.getElementById("ops").innerHTML = r.view === "runs" ? startPanel() : r.view === "task" ? taskPanel(d.task) : "";
}
function opsOutcome(text, ok) {
  const p = document.getElementById("ops-result");
  if (p) { p.textContent = text; p.dataset.outcome = ok ? "ok" : "error"; }
}
function opsDone(what) {
  return (out) => {
    actionResult[out.root_id] = what(out);
    opsOutcome(actionResult[out.root_id], true);
    location.hash = `/run/${encodeURIComponent(out.root_id)}`;
  };
}
function opsFailed(button) {
  return (e) => { if (button) button.disabled = false; opsOutcome(String(e.message || e), false); };
}
document.addEventListener("submit", (e) => {
  const f = e.target;
  if (!(f instanceof HTMLFormElement) || !["start-goal", "start-plan", "fork", "rerun"].includes(f.id)) return;
  e.preventDefault();
  const button = f.querySelector("button[type=submit]");
  if (button) button.disabled = true;
  opsOutcome("…", true);
  const by = operator();
  if (f.id === "start-goal" || f.id === "start-plan") {
    const body = f.id === "start-goal" ? {goal: document.getElementById("goal").value, by} : {plan: document.getElementById("plan-text").value, by};
    postJSON("/api/runs", body).then(opsDone((o) => `run ${o.root_id} started by ${o.by}`)).catch(opsFailed(button));
    return;
  }
  const task = f.dataset.task;
  if (f.id === "rerun") {
    postJSON(`/api/tasks/${encodeURIComponent(task)}/rerun`, {model: document.getElementById("rerun-model").value, by})
      .then(opsDone((o) => `re-run of ${o.rerun_of} by ${o.by}: ${o.rerun.length} task(s) run again, ${o.reused.length} reused`)).catch(opsFailed(button));
    return;
  }
  const body = {at: document.getElementById("fork-at").value, model: document.getElementById("fork-model").value, by};
  const area = document.getElementById("fork-inputs");
  let inputs;
  try { inputs = JSON.parse(area.value); } catch (err) { opsFailed(button)(new Error("the inputs are not JSON: " + err.message)); return; }
  if (JSON.stringify(inputs) !== area.dataset.original) body.inputs = inputs;  // overridden
  postJSON(`/api/tasks/${encodeURIComponent(task)}/fork`, body)
    .then(opsDone((o) => `forked ${o.forked_from} by ${o.by}: ${o.rerun.length} task(s) run again, ${o.reused.length} reused`)).catch(opsFailed(button));
});
document.addEventListener("change", (e) => {  // a plan file: read into the plan's text box
  const t = e.target;
  if (!(t instanceof HTMLInputElement) || t.id !== "plan-file" || !t.files || !t.files.length) return;
  t.files[0].text().then((text) => { document.getElementById("plan-text").value = text; t.dataset.loaded = t.files[0].name; })
    .catch((err) => opsOutcome("cannot read the file: " + err, false));
});

// -- the route: #/?filters, #/run/ID?show=&offset=, #/task/ID --------------------------
function route() {
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = Object.fromEntries(new URLSearchParams(query || ""));
  const d = (path || "").match(/^\/diff\/([^/]+)\/([^/]+)$/);
  if (d) return {view: "diff", id: decodeURIComponent(d[1]), other: decodeURIComponent(d[2]), params};
  const m = (path || "").match(/^\/(run|task)\/(.+)$/);
  return m ? {view: m[1], id: decodeURIComponent(m[2]), params} : {view: "runs", id: null, params};
}
function go(change) {
  const r = route();
  const params = {...r.params, ...change};
  for (const k of Object.keys(params)) if (params[k] === "" || params[k] === null || params[k] === undefined || (k === "offset" && Number(params[k]) === 0)) delete params[k];
  const q = new URLSearchParams(params).toString();
  location.hash = (r.view === "runs" ? "/" : `/${r.view}/${encodeURIComponent(r.id)}`) + (q ? "?" + q : "");
}
function pager(total, offset, limit) {
  offset = Number(offset) || 0;
  const last = Math.min(offset + limit, total);
  return `<div class="pager" data-total="${total}" data-offset="${offset}">
    <button data-page="${Math.max(offset - limit, 0)}" ${offset <= 0 ? "disabled" : ""}>‹ newer</button>
    <span>${total ? offset + 1 : 0}–${last} of ${total}</span>
    <button data-page="${offset + limit}" ${last >= total ? "disabled" : ""}>older ›</button></div>`;
}

// -- runs -------------------------------------------------------------------------------
const RUNS_PAGE = 50;
function runsView(data, p) {
  const rows = data.runs.map((r) => `<tr data-root="${esc(r.root_id)}" data-status="${esc(r.status)}">
    <td>${idLink("run", r.root_id)}</td><td>${status(r.status)}${r.reason ? ` <span class="reason">${esc(r.reason)}${degraded(r)}</span>` : ""}</td>
    <td>${esc(r.goal)}</td><td class="id">${esc(r.plan_id)}</td><td class="nowrap">${fmtTime(r.started_at)}</td>
    <td class="nowrap">${r.ended_at === null ? since(r.started_at) : fmtDur(r.duration_s)}</td>
    <td data-tasks>${r.tasks_done}/${r.tasks_total}${r.tasks_failed ? ` (${r.tasks_failed} failed)` : ""}</td>
    <td>${(r.input_tokens + r.output_tokens).toLocaleString()}</td><td data-cost class="nowrap">${cost(r.cost)}</td></tr>`).join("");
  const opt = (v) => `<option value="${v}" ${p.status === v ? "selected" : ""}>${v || "any status"}</option>`;
  const day = (t) => t ? new Date(Number(t) * 1000).toISOString().slice(0, 10) : "";
  return `<form id="filters" class="filters">
    <select name="status">${["", "running", "awaiting_approval", "completed", "failed", "halted", "cancelled"].map(opt).join("")}</select>
    <input name="q" placeholder="goal contains…" value="${esc(p.q)}">
    <input name="plan" placeholder="plan id contains…" value="${esc(p.plan)}">
    <input name="agent" placeholder="agent id" value="${esc(p.agent)}">
    <label>from <input type="date" name="since" value="${day(p.since)}"></label>
    <label>to <input type="date" name="until" value="${day(p.until ? Number(p.until) - 86399 : "")}"></label>
    <button type="submit">Filter</button> <a href="#/">clear</a></form>
    <h2>Runs <span class="muted" id="runs-count" data-total="${data.total}">(${data.total} matching)</span></h2>
    ${pager(data.total, data.offset, RUNS_PAGE)}
    <table id="runs"><thead><tr><th>root</th><th>status</th><th>goal</th><th>plan</th><th>started</th>
    <th>duration</th><th>tasks</th><th>tokens</th><th title="USD; prices: ${esc(data.prices)}">cost</th></tr></thead><tbody>${rows}</tbody></table>`;
}
document.addEventListener("submit", (e) => {
  if (e.target instanceof HTMLFormElement && e.target.id === "compare") {
    e.preventDefault();
    const other = String(new FormData(e.target).get("other") || "").trim();
    if (other) location.hash = `/diff/${encodeURIComponent(e.target.dataset.root)}/${encodeURIComponent(other)}`;
    return;
  }
  if (!(e.target instanceof HTMLFormElement) || e.target.id !== "filters") return;
  e.preventDefault();
  const f = new FormData(e.target);
  const t = (v, end) => v ? String(Date.parse(v + "T00:00:00Z") / 1000 + (end ? 86399 : 0)) : "";
  go({status: f.get("status"), q: f.get("q"), plan: f.get("plan"), agent: f.get("agent"),
      since: t(f.get("since")), until: t(f.get("until"), true), offset: 0});
});

// -- a run: summary, actions, filters, dependency graph, Gantt, paged task table ----------
function graph(t) {
  // the plan's dependencies among the tasks shown: layers top-down by longest path
  const nodes = [];
  const walk = (n) => { nodes.push(n); (n.children || []).forEach(walk); };
  (t.tasks || []).forEach(walk);
  if (!nodes.length) return "";
  const byId = Object.fromEntries(nodes.map((n) => [n.task_id, n]));
  const layer = {};
  const depth = (n, seen) => {
    if (layer[n.task_id] !== undefined) return layer[n.task_id];
    if (seen.has(n.task_id)) return 0;
    seen.add(n.task_id);
    const parents = [...(n.deps || []), ...(n.parent_id && byId[n.parent_id] ? [n.parent_id] : [])].filter((d) => byId[d]);
    const l = parents.length ? 1 + Math.max(...parents.map((d) => depth(byId[d], seen))) : 0;
    return (layer[n.task_id] = l);
  };
  nodes.forEach((n) => depth(n, new Set()));
  const W = 168, H = 26, GX = 12, GY = 30, PER = 7;
  const pos = {}, rows = [];
  let y = 6;
  const maxL = Math.max(...Object.values(layer));
  for (let l = 0; l <= maxL; l++) {
    const here = nodes.filter((n) => layer[n.task_id] === l);
    here.forEach((n, i) => { pos[n.task_id] = {x: 6 + (i % PER) * (W + GX), y: y + Math.floor(i / PER) * (H + 8)}; });
    y += Math.ceil(here.length / PER) * (H + 8) + GY - 8;
  }
  const edges = [];
  for (const n of nodes) {
    const to = pos[n.task_id];
    for (const d of n.deps || []) {
      const from = pos[d];
      if (from) edges.push(`<line class="edge" data-from="${esc(d)}" data-to="${esc(n.task_id)}" x1="${from.x + W / 2}" y1="${from.y + H}" x2="${to.x + W / 2}" y2="${to.y}"/>`);
      else edges.push(`<text class="ext" x="${to.x}" y="${to.y - 2}">↑ ${esc(d)}</text>`);
    }
    if (n.parent_id && pos[n.parent_id]) {
      const from = pos[n.parent_id];
      edges.push(`<line class="edge sub" x1="${from.x + W / 2}" y1="${from.y + H}" x2="${to.x + W / 2}" y2="${to.y}"/>`);
    }
  }
  const boxes = nodes.map((n) => { const p = pos[n.task_id];
    return `<a href="#/task/${encodeURIComponent(n.task_id)}"><g class="node" data-task="${esc(n.task_id)}" data-status="${esc(n.status)}">
      <rect class="${esc(n.status || "open")}" x="${p.x}" y="${p.y}" width="${W}" height="${H}" rx="4"/>
      <text x="${p.x + 6}" y="${p.y + 17}">${esc((n.capability || "?") + " · " + n.task_id).slice(0, 26)}</text>
      <title>${esc(n.task_id + " — " + n.status + (n.deps && n.deps.length ? " after " + n.deps.join(", ") : ""))}</title></g></a>`; }).join("");
  const width = Math.min(nodes.length, PER) * (W + GX) + 12;
  return `<svg id="graph" width="${width}" height="${y}" viewBox="0 0 ${width} ${y}">${edges.join("")}${boxes}</svg>`;
}
function tasksTable(data) {
  const r = data.run || {};
  const waiting = new Set(r.waiting || []);
  return data.tasks.map((k) => {
    const live = RUNNING.includes(k.status) || WAITING.includes(k.status);
    const reason = k.status === "completed" ? "" : k.reason;  // a standby's "result_ignored" is no reason
    return `<tr data-task="${esc(k.task_id)}" data-status="${esc(k.status)}">
      <td>${idLink("task", k.task_id)}</td><td>${esc(k.capability)}</td><td>${esc(k.agent_id)}</td>
      <td>${status(k.status)}</td><td>${k.attempts}</td>
      <td class="nowrap">${live ? since(k.updated_at, RUNNING.includes(k.status) ? ((k.reason || "").startsWith("queued for the model's limit") ? "queued" : "running") : "waiting") : ""}</td>
      <td class="reason">${esc(reason)}</td>
      <td>${k.capability === "user_input" && k.status === "awaiting_approval" ? `<a class="answer-link" href="#/task/${encodeURIComponent(k.task_id)}">answer the question…</a>`
        : k.status === "awaiting_approval" || waiting.has(k.task_id) ? approvalButtons(k.task_id)
        : FINISHED_BAD.includes(k.status) ? `<a class="rerun-link" href="#/task/${encodeURIComponent(k.task_id)}" title="re-run it or fork from it, on its page">re-run…</a>` : ""}</td>
      <td><details data-events="${esc(k.task_id)}"><summary>events</summary><div>loading…</div></details></td></tr>`;
  }).join("");
}
function runView(data) {
  const r = data.run || {}, t = data.timeline, c = data.counts || {};
  const sum = (xs) => xs.reduce((a, s) => a + (c[s] || 0), 0);
  const all = Object.values(c).reduce((a, b) => a + b, 0);
  const tabs = [["all", all], ["failed", sum(["failed", "halted", "cancelled"])], ["waiting", sum(WAITING)], ["running", sum(RUNNING)]]
    .map(([k, n]) => `<button class="tab ${data.show === k ? "on" : ""}" data-show="${k}">${k} (${n})</button>`).join("");
  const open = r.status === "running" || r.status === "awaiting_approval";
  const end = r.ended_at || now();
  return `<h2>Run <span class="id">${esc(data.root_id)}</span></h2>
    <p id="run-status" data-status="${esc(r.status)}">${status(r.status)} ${r.reason ? `<span class="reason">${esc(r.reason)}${degraded(r)}</span>` : ""}
    · ${esc(r.goal)} · plan <span class="id">${esc(r.plan_id)}</span> · started ${fmtTime(r.started_at)}
    · ${open ? since(r.started_at) : fmtDur(r.duration_s)} · tasks ${r.tasks_done}/${r.tasks_total} · ${((r.input_tokens || 0) + (r.output_tokens || 0)).toLocaleString()} tokens</p>
    ${r.parent_root ? `<p id="run-parent">child run of ${idLink("run", r.parent_root)}, started by its task ${idLink("task", r.parent_task)}</p>` : ""}
    ${(data.children || []).length ? `<p id="child-runs">child runs: ${data.children.map((k) => `${idLink("run", k.root_id)} ${status(k.status)} <span class="muted">(task ${esc(k.parent_task)})</span>`).join(" · ")}
      <br><span id="tree-spend">with its child runs: ${data.tree.tokens.toLocaleString()} tokens, cost ${cost(data.tree.cost)} <span class="muted">(${data.tree.runs} runs)</span></span></p>` : ""}
    <p id="run-cost">cost ${cost(data.cost)} <span class="muted">(USD; prices: ${esc(data.prices)})</span>
      ${costTable("cost-by-model", "model", data.cost_by_model)}${costTable("cost-by-task", "task", data.cost_by_task)}</p>
    <form id="compare" class="filters" data-root="${esc(data.root_id)}"><label>compare with <input name="other" placeholder="another run's id"></label> <button type="submit">Diff</button></form>
    <p class="actions">${open ? `<input id="cancel-note" placeholder="why (optional)"> <button class="deny" data-cancel="${esc(data.root_id)}" id="cancel">Cancel run</button>` : ""}
      <a id="download-replay" href="${url(`/api/runs/${encodeURIComponent(data.root_id)}/replay.html`)}" download>Download HTML replay</a>
      · <a id="download-traces" href="${url(`/api/runs/${encodeURIComponent(data.root_id)}/traces.json`)}" download>Export trace spans (JSON)</a>
      <span id="action-result" class="muted">${esc(actionResult[data.root_id] || "")}</span></p>
    <div class="tabs" id="show">${tabs}</div>
    ${t ? `<h2>Dependencies <span class="muted">(tasks shown)</span></h2><div class="graph-wrap">${graph(t)}</div>` : ""}
    <h2>Attempts</h2><div class="cb-gantt">${LEGENDS}<div id="gantt" data-start="${r.started_at}" data-end="${end}"></div></div>
    <h2>Tasks</h2>${pager(data.total, data.offset, data.limit)}
    <table id="tasks"><thead><tr><th>task</th><th>capability</th><th>agent</th><th>status</th>
    <th>att</th><th>for</th><th>reason</th><th></th><th></th></tr></thead><tbody>${tasksTable(data)}</tbody></table>
    ${t && t.run && t.run.length ? `<details id="run-events"><summary>the run's own events (${t.run.length})</summary>${stepsTable(t.run.map((s) => ({position: s.position, time: s.time, type: s.kind, actor: s.actor, reason: s.reason || s.detail, data: s.payload})), "")}</details>` : ""}`;
}
function costTable(id, what, rows) {
  if (!rows || !rows.length) return "";
  const key = what === "task" ? "task_id" : "model";
  const body = rows.map((x) => `<tr data-${what}="${esc(x[key])}"><td>${what === "task" ? idLink("task", x[key]) : `<code>${esc(x[key] || "?")}</code>`}</td>
    <td>${what === "task" ? esc((x.models || []).join(", ")) : ""}</td><td>${x.calls}</td><td>${(x.input_tokens + x.output_tokens).toLocaleString()}</td><td>${cost(x.cost)}</td></tr>`).join("");
  return `<details id="${id}"><summary>cost per ${what} (${rows.length})</summary><table><thead><tr><th>${what}</th><th>${what === "task" ? "models" : ""}</th>
    <th>calls</th><th>tokens</th><th>cost</th></tr></thead><tbody>${body}</tbody></table></details>`;
}
// -- two runs compared: cardbus diff A B --------------------------------------------------
function diffTask(t) {
  if (!t) return `<span class="muted">—</span>`;
  const models = t.calls.filter((c) => c.kind === "model").length;
  const how = t.reused_from ? "reused" : `${models} model / ${t.calls.length - models} tool call(s)`;
  return `${status(t.status)} ${t.reason ? `<span class="reason">${esc(t.reason)}</span>` : ""} · ${esc(t.agents.join(", ") || "-")}
    · <code>${esc(t.models.join(", ") || "-")}</code> · ${how}<details><summary>output</summary>${json(t.output)}</details>`;
}
function diffView(d) {
  const runLine = (name, r) => `<tr data-side="${name}"><th>${name}</th><td>${idLink("run", r.root_id)}</td><td>${status(r.status)}</td><td>${esc(r.goal)}</td>
    <td>${r.rerun_of ? `re-run of <span class="id">${esc(r.rerun_of)}</span>${r.offline ? " (offline)" : ""}` : r.forked_from ? `fork of <span class="id">${esc(r.forked_from)}</span>` : ""}</td></tr>`;
  const f = d.first_divergence;
  const first = f === null ? `<p id="first-divergence" data-what="none">none: the same requests, answers and outputs</p>`
    : `<div id="first-divergence" data-what="${esc(f.what)}" data-task="${esc(f.task)}"><p><b>${esc(f.summary)}</b></p>
       <p class="muted">event in A: <span class="id">${esc(f.event_a || "-")}</span> · event in B: <span class="id">${esc(f.event_b || "-")}</span></p>
       ${f.diff && f.diff.length ? `<pre>${esc(f.diff.join("\n"))}</pre>` : ""}</div>`;
  const rows = d.tasks.map((p) => `<tr class="${p.differs.length ? "differs" : "same"}" data-key="${esc(p.key)}"><td class="id">${esc(p.key)}</td>
    <td class="differs">${p.differs.length ? esc(p.differs.join(", ")) : `<span class="muted">${p.reused_in ? `reused in ${esc(p.reused_in)}` : "same"}</span>`}</td><td>${diffTask(p.a)}</td><td>${diffTask(p.b)}</td></tr>`).join("");
  return `<h2>Diff of two runs</h2><table id="diff-runs">${runLine("A", d.a)}${runLine("B", d.b)}</table>
    <p class="muted">plan: ${d.a.plan.join(",") === d.b.plan.join(",") ? `${esc(d.a.plan.join(", "))} (the same tasks)` : `A ${esc(d.a.plan.join(", "))} · B ${esc(d.b.plan.join(", "))}`}</p>
    <h2>First divergence</h2>${first}
    <h2>Tasks</h2><table id="diff-tasks"><thead><tr><th>task</th><th>differs</th><th>A</th><th>B</th></tr></thead><tbody>${rows}</tbody></table>`;
}
function drawGantt(data) {
  const el = document.getElementById("gantt");
  if (!el || !data.timeline) return;
  const r = data.run || {};
  const end = r.ended_at || Math.max(now(), data.timeline.end);
  cardbusGantt(data.timeline, el, {start: Math.min(r.started_at || data.timeline.start, data.timeline.start), end: end,
    link: (id) => "#/task/" + encodeURIComponent(id)});
}

// -- a task: inputs as planned and as received, output, calls, steps ----------------------
function stepsTable(steps, id) {
  const rows = steps.map((s) => `<tr data-position="${s.position}"><td class="nowrap">${fmtTime(s.time)}</td>
    <td>${esc(s.type)}${s.attempt ? " #" + s.attempt : ""}</td><td>${esc(s.agent_id || s.actor)}</td><td class="muted">${esc(s.actor)}</td>
    <td class="reason">${esc(s.reason)}</td>
    <td><details><summary>data</summary>${json(s.data)}</details></td></tr>`).join("");
  return `<table ${id ? `id="${id}"` : ""} class="steps"><thead><tr><th>time</th><th>event</th><th>agent</th><th>actor</th><th>reason</th><th></th></tr></thead>
    <tbody>${rows}</tbody></table>`;
}
function receivedInputs(data) {
  const got = data.received || [];
  if (!got.length) return `<p class="muted">not dispatched yet</p>`;
  return got.map((d) => `<div class="received" data-attempt="${d.attempt}" data-agent="${esc(d.agent_id)}">
    <div class="muted">attempt #${d.attempt} · ${esc(d.agent_id)} · sha256 ${esc((d.digest || "").slice(0, 12))}${d.trimmed ? " · trimmed to fit the agent's context" : ""}</div>
    ${d.inputs === null || d.inputs === undefined ? `<p class="muted">not kept in the log (${d.bytes || "?"} bytes): only its digest</p>` : json(d.inputs)}</div>`).join("");
}
function taskView(data) {
  const k = data.task;
  return `<h2>Task <span class="id">${esc(k.task_id)}</span></h2>
    <p id="task-status" data-status="${esc(k.status)}">${status(k.status)} · ${esc(k.capability)} · run ${idLink("run", k.root_id)}
    ${k.agent_id ? "· agent " + esc(k.agent_id) : ""} · attempts ${k.attempts}
    ${RUNNING.includes(k.status) || WAITING.includes(k.status) ? " · " + since(k.updated_at, k.status === "awaiting_approval" ? "waiting for approval" : "in " + k.status) : ""}
    ${k.reason && k.status !== "completed" ? `· <span class="reason">${esc(k.reason)}</span>` : ""}</p>
    ${k.status === "awaiting_approval" ? (data.questions && data.questions.length ? questionForm(data.questions[0]) : `<p>${approvalButtons(k.task_id)}</p>`) : ""}
    <h2>Goal</h2><p id="task-goal">${esc(k.goal || data.run_goal || "")}${!k.goal && data.run_goal ? ` <span class="muted">(the run's goal)</span>` : ""}</p>
    <div class="io"><div><h2>Inputs as planned</h2><div id="task-input">${json(k.input)}</div></div>
    <div><h2>Inputs the agent received</h2><div id="task-received">${receivedInputs(data)}</div></div></div>
    <h2>Output</h2><div id="task-output">${json(k.output)}</div>
    ${callsTable(data.calls)}
    <h2>Steps</h2>${stepsTable(data.steps, "steps")}`;
}

function short(v, k) {
  const s = typeof v === "string" ? v : JSON.stringify(v);
  const one = (s || "").split(/\s+/).join(" ").trim();
  return one.length > (k || 60) ? one.slice(0, (k || 60) - 1) + "…" : one;
}
function promptText(c) {
  const r = c.prompt;
  if (r === null || r === undefined) return "(not kept: sha256 " + (c.request_digest || "").slice(0, 12) + ")";
  const m = r.messages;
  if (Array.isArray(m) && m.length && typeof m[m.length - 1].content === "string") return short(m[m.length - 1].content);
  return short(typeof r.prompt === "string" ? r.prompt : r);
}
function answerText(c) {
  if (c.error !== null && c.error !== undefined) return "error " + (c.error_type || "") + ": " + short(c.error);
  const a = c.answer;
  if (a === null || a === undefined) return c.status === "open" ? "(no answer recorded)" : "(not kept)";
  if (typeof a.text === "string" && a.text) return short(a.text);
  if (Array.isArray(a.tool_calls) && a.tool_calls.length) return "tool calls: " + a.tool_calls.map((t) => t.name || (t.function || {}).name).join(", ");
  return short(a);
}
const fold = (key, summary, value) => `<details data-key="${esc(key)}"><summary>${esc(summary)}</summary>${json(value)}</details>`;
function callRow(c) {
  const how = c.replayed_from ? `<span class="replayed">replayed from <span class="id">${esc(c.replayed_from)}</span></span>`
    : c.queued ? `<span class="reason queued">queued for the model's limit</span>`
    : c.status === "open" ? `<span class="reason">no answer recorded</span>`
    : c.status === "unknown" ? `<span class="reason">effect unknown</span>` : `<span class="live">live</span>`;
  const attrs = `data-kind="${esc(c.kind)}" data-attempt="${c.attempt}" data-seq="${c.seq}" data-replayed="${c.replayed_from ? "yes" : "no"}" data-status="${esc(c.kind === "effect_unknown" ? c.decision : c.status)}"`;
  const k = "call-" + c.position;
  if (c.kind === "model") {
    const answer = c.error !== null && c.error !== undefined ? {error: c.error, error_type: c.error_type} : c.answer;
    return `<tr class="call" ${attrs}><td>#${c.seq}</td><td>model <code>${esc(c.response_model || c.model)}</code></td>
      <td>${c.input_tokens}+${c.output_tokens}</td><td>${fmtDur(c.latency_s)}${c.queued_s ? ` <span class="queued">(${fmtDur(c.queued_s)} queued)</span>` : ""}</td><td>${how}</td><td></td>
      <td>${fold(k + "-prompt", promptText(c), c.prompt)}</td><td>${fold(k + "-answer", answerText(c), answer)}</td></tr>`;
  }
  if (c.kind === "tool") {
    const result = c.error !== null && c.error !== undefined
      ? fold(k + "-result", "error " + (c.error_type || "") + ": " + short(c.error, 40), {error: c.error, error_type: c.error_type})
      : c.end === null ? `<span class="reason">no result recorded</span>` : fold(k + "-result", short(c.result, 40), c.result);
    return `<tr class="call" ${attrs}><td>#${c.seq}</td><td>tool <code>${esc(c.tool)}</code></td><td></td>
      <td>${fmtDur(c.duration_s)}</td><td>${how}</td><td class="id">${esc(c.idempotency_key)}</td>
      <td>${fold(k + "-args", short(c.arguments, 40), c.arguments)}</td><td>${result}</td></tr>`;
  }
  return `<tr class="call" ${attrs}><td>#${c.seq}</td><td class="reason">effect unknown <code>${esc(c.tool)}</code></td><td></td><td></td>
    <td>decision <b>${esc(c.decision)}</b></td><td class="id">${esc(c.idempotency_key)}</td>
    <td>call <span class="id">${esc(c.requested_event_id)}</span></td>
    <td>${c.decision === "ask" ? "waits for an operator before repeating it" : "repeated with the same key"}</td></tr>`;
}
function callsTable(calls) {
  if (!calls || !calls.length) return "";
  let rows = "", last = null;
  for (const c of calls) {
    const group = c.attempt + " " + c.agent_id;
    if (group !== last) {
      last = group;
      rows += `<tr class="call-attempt" data-attempt="${c.attempt}"><th colspan="8">attempt #${c.attempt} · ${esc(c.agent_id)}</th></tr>`;
    }
    rows += callRow(c);
  }
  return `<h2>Model and tool calls</h2><table id="calls"><thead><tr><th>call</th><th>what</th><th>tokens</th><th>latency</th>
    <th>live / replayed</th><th>key</th><th>prompt / arguments</th><th>answer / result</th></tr></thead><tbody>${rows}</tbody></table>`;
}

let source = null, sourceKey = null, timer = null, last = null, generation = 0;
function showError(e) { document.getElementById("error").textContent = e ? String(e.message || e) : ""; }
async function refresh() {
  const r = route();
  // a refresh that a newer one overtook draws nothing: an older, slower answer
  // (the run left a moment ago) must not replace the view of the newer route
  const mine = ++generation;
  try {
    let d, html, root = null;
    if (r.view === "run") {
      d = await getJSON(`/api/runs/${encodeURIComponent(r.id)}`, {show: r.params.show, offset: r.params.offset});
      html = runView(d); root = d.root_id;
    } else if (r.view === "diff") {
      d = await getJSON("/api/diff", {a: r.id, b: r.other}); html = diffView(d);
    } else if (r.view === "task") {
      d = await getJSON(`/api/tasks/${encodeURIComponent(r.id)}`);
      if (d.task.capability === "user_input" && d.task.status === "awaiting_approval") {  // a question: its form
        d.questions = (await getJSON(`/api/tasks/${encodeURIComponent(d.task.task_id)}/questions`)).questions;
      }
      html = taskView(d); root = d.task.root_id;
    }
    else { d = await getJSON("/api/runs", {...r.params, limit: RUNS_PAGE}); html = runsView(d, r.params); }
    if (mine !== generation) return;
    if (d.now) skew = d.now - Date.now() / 1000;
    const open = [...document.querySelectorAll("details[open]")].map((x) => x.dataset.key ? "key:" + x.dataset.key : x.dataset.events ? "ev:" + x.dataset.events : x.closest("tr")?.dataset.position);
    const focus = document.activeElement && document.activeElement.matches("input") ? [document.activeElement.dataset.note || document.activeElement.id, document.activeElement.value] : null;
    const notes = Object.fromEntries([...document.querySelectorAll("input[data-note]")].map((i) => [i.dataset.note, i.value]));
    document.getElementById("view").innerHTML = html;
    renderOps(r, d);
    if (r.view === "run") drawGantt(d);
    for (const [id, v] of Object.entries(notes)) { const i = document.querySelector(`input[data-note="${CSS.escape(id)}"]`); if (i) i.value = v; }
    if (focus) { const i = document.querySelector(`input[data-note="${CSS.escape(focus[0] || "")}"]`) || document.getElementById(focus[0] || ""); if (i) { i.value = focus[1]; i.focus(); } }
    for (const p of open) {
      const x = p && p.startsWith("key:") ? document.querySelector(`details[data-key="${p.slice(4)}"]`)
        : p && p.startsWith("ev:") ? document.querySelector(`details[data-events="${CSS.escape(p.slice(3))}"]`)
        : document.querySelector(`tr[data-position="${p}"] details`);
      x?.setAttribute("open", "");
    }
    document.body.dataset.view = r.view;
    document.body.dataset.rendered = String(performance.now());
    showError(null);
    listen(root, d.position);
  } catch (e) { if (mine === generation) showError(e); }
}
function schedule() { clearTimeout(timer); timer = setTimeout(refresh, 150); }
// model answers as they are written (/api/chunks, a view: the log keeps each whole answer);
// drawn outside #view, which every refresh redraws
let chunkSource = null, chunkRoot = null;
function listenChunks(root) {
  if (chunkRoot === root) return;
  if (chunkSource) chunkSource.close();
  chunkSource = null; chunkRoot = root;
  const panel = document.getElementById("streaming"), streams = document.getElementById("streams");
  streams.innerHTML = ""; panel.hidden = true;
  if (!root) return;
  chunkSource = new EventSource(url("/api/chunks", {root: root}));
  chunkSource.onopen = () => { document.body.dataset.chunks = root; };
  chunkSource.addEventListener("chunk", (e) => {
    const c = JSON.parse(e.data), key = `${c.task}~${c.attempt}~${c.call}`;
    let box = streams.querySelector(`div[data-call="${CSS.escape(key)}"]`);
    if (!box) {
      box = document.createElement("div");
      box.className = "stream"; box.dataset.call = key; box.dataset.task = c.task; box.dataset.state = "writing";
      box.innerHTML = `<b>${esc(c.task)}</b> <span class="muted">attempt #${c.attempt}, model call ${c.call}</span><pre class="stream-text"></pre>`;
      streams.appendChild(box);
    }
    panel.hidden = false;
    if (c.done) { box.dataset.state = "written"; return; }
    box.querySelector(".stream-text").textContent += c.text;
    box.dataset.pieces = String(Number(box.dataset.pieces || 0) + 1);
  });
}
function listen(root, position) {
  const key = root || "*";
  listenChunks(root);
  if (source && sourceKey === key) return;
  if (source) source.close();
  sourceKey = key;
  // from the position the view was read at: nothing appended since is missed
  source = new EventSource(url("/api/events", {root: root, from: position}));
  const live = document.getElementById("live");
  source.onopen = () => { live.textContent = "live"; live.className = "on"; document.body.dataset.live = "yes"; };
  source.onerror = () => { live.textContent = "reconnecting…"; live.className = ""; document.body.dataset.live = "no"; };
  source.addEventListener("append", schedule);
}
const op = document.getElementById("operator");
op.value = localStorage.getItem("cardbus-operator") || "";
op.addEventListener("change", () => localStorage.setItem("cardbus-operator", op.value));
window.addEventListener("hashchange", refresh);
// what the console can do (its actions need agents), then the first view
getJSON("/api/console").then((d) => {
  consoleInfo = d.actions;
  document.getElementById("you").textContent = `acting as ${d.you}`;
}).catch(showError).finally(refresh);
"""
    + """</script>
</body>
</html>
"""
)  # the page's lines are HTML and JS, kept as written
