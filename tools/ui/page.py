"""The web console's one page: plain HTML, CSS and a small vanilla script.

Nothing is loaded from elsewhere (no CDN, no build step): the page fetches
the app's JSON views and listens to ``/api/events`` (server-sent events),
refetching the view it shows when an event of interest arrives. Views, by
the URL's fragment: ``#/`` the runs, ``#/run/ID`` a run's task table and
timeline, ``#/task/ID`` a task's steps with inputs, outputs and reasons, and
its model calls (prompt and answer expandable), tool calls and unknown effects
by attempt, each marked live or replayed (naming the event it replays).
Elements carry ``data-*`` attributes (status, ids) for tests and scripts.
"""

from __future__ import annotations

__all__ = ["PAGE"]

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>cardbus console</title>
<style>
  body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
  header { background: #1d2330; color: #fff; padding: 8px 16px; display: flex; gap: 16px;
           align-items: baseline; }
  header a { color: #fff; text-decoration: none; font-weight: 600; }
  #live { font-size: 12px; color: #9aa4b5; }
  #live.on { color: #7ee2a8; }
  main { padding: 12px 16px; }
  table { border-collapse: collapse; width: 100%; background: #fff; }
  th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #e3e6eb;
           vertical-align: top; }
  th { background: #eef0f4; font-weight: 600; }
  .id, code, pre { font-family: ui-monospace, monospace; font-size: 12px;
                   overflow-wrap: anywhere; word-break: break-all; }
  pre { white-space: pre-wrap; background: #f0f2f5; padding: 6px; margin: 4px 0; }
  .status { font-weight: 600; }
  .s-completed { color: #17803d; } .s-failed { color: #c62828; } .s-halted { color: #8e24aa; }
  .s-timed_out { color: #e65100; } .s-cancelled { color: #777; }
  .s-running, .s-dispatched { color: #0277bd; }
  .s-awaiting_approval, .s-pending { color: #b26a00; }
  .s-needs_revision, .s-needs_input { color: #6a1b9a; }
  .muted { color: #6b7380; }
  .reason { color: #a33; }
  button { font: inherit; padding: 2px 10px; margin-right: 6px; cursor: pointer; }
  button.approve { background: #e3f5e9; border: 1px solid #17803d; }
  button.deny { background: #fdeaea; border: 1px solid #c62828; }
  .bar { position: relative; height: 14px; background: #eef0f4; min-width: 200px; }
  .bar span { position: absolute; top: 2px; height: 10px; background: #5c8fd6; }
  .bar span.s-completed { background: #3aa76d; } .bar span.s-failed { background: #d9534f; }
  .bar span.s-halted { background: #9c4dcc; } .bar span.s-awaiting_approval { background: #e0a030; }
  h2 { font-size: 16px; margin: 16px 0 6px; }
  #error { color: #c62828; }
  details summary { cursor: pointer; color: #345; }
  .replayed { color: #8a6d00; } .live { color: #17803d; }
  tr.call-attempt th { background: #f6f7f9; }
</style>
</head>
<body data-live="no" data-view="">
<header><a href="#/">cardbus console</a><span id="live">connecting…</span></header>
<main>
<div id="error"></div>
<div id="view"></div>
</main>
<script>
"use strict";
const token = new URLSearchParams(location.search).get("token");
const esc = (v) => String(v === null || v === undefined ? "" : v).replace(/[&<>"']/g,
  (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
function url(path, params) {
  const u = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params || {})) if (v !== null && v !== undefined) u.searchParams.set(k, v);
  if (token) u.searchParams.set("token", token);
  return u.pathname + u.search;
}
async function getJSON(path, params) {
  const r = await fetch(url(path, params));
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}
function fmtTime(t) { return t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : ""; }
function fmtDur(s) {
  if (s === null || s === undefined) return "";
  if (s < 1) return Math.round(s * 1000) + " ms";
  if (s < 120) return s.toFixed(2) + " s";
  return (s / 60).toFixed(1) + " min";
}
const status = (s) => `<span class="status s-${esc(s)}">${esc(s || "?")}</span>`;
const json = (v) => `<pre>${esc(JSON.stringify(v, null, 2))}</pre>`;
const idLink = (kind, id) => `<a class="id" href="#/${kind}/${encodeURIComponent(id)}">${esc(id)}</a>`;

function buttons(taskId) {
  return `<button class="approve" data-approve="${esc(taskId)}">Approve</button>` +
         `<button class="deny" data-deny="${esc(taskId)}">Deny</button>`;
}
async function answer(taskId, approve) {
  const r = await fetch(url(`/api/tasks/${encodeURIComponent(taskId)}/${approve ? "approve" : "deny"}`), {
    method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({by: "ui"}),
  });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  refresh();
}
document.addEventListener("click", (e) => {
  const t = e.target;
  if (!(t instanceof HTMLElement)) return;
  const id = t.dataset.approve || t.dataset.deny;
  if (!id) return;
  t.disabled = true;
  answer(id, !!t.dataset.approve).catch(showError);
});

function runsView(data) {
  const rows = data.runs.map((r) => `<tr data-root="${esc(r.root_id)}" data-status="${esc(r.status)}">
    <td>${idLink("run", r.root_id)}</td><td>${status(r.status)}${r.reason ? ` <span class="reason">${esc(r.reason)}</span>` : ""}</td>
    <td>${esc(r.goal)}</td><td class="id">${esc(r.plan_id)}</td><td>${fmtTime(r.started_at)}</td>
    <td>${fmtDur(r.duration_s)}${r.ended_at === null ? " so far" : ""}</td>
    <td data-tasks>${r.tasks_done}/${r.tasks_total}${r.tasks_failed ? ` (${r.tasks_failed} failed)` : ""}</td>
    <td>${(r.input_tokens + r.output_tokens).toLocaleString()}</td></tr>`).join("");
  return `<h2>Runs <span class="muted">(${data.runs.length})</span></h2>
    <table id="runs"><thead><tr><th>root</th><th>status</th><th>goal</th><th>plan</th><th>started</th>
    <th>duration</th><th>tasks</th><th>tokens</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function timelineRows(t) {
  const steps = [...t.run.map((s) => ({...s, task: t.root_id}))];
  const walk = (n) => { for (const s of n.steps) steps.push({...s, task: n.task_id}); n.children.forEach(walk); };
  t.tasks.forEach(walk);
  steps.sort((a, b) => a.position - b.position);
  return steps.map((s) => `<tr data-position="${s.position}"><td>${esc(s.at.slice(11, 23))}</td>
    <td class="id">${esc(s.task)}</td><td>${esc(s.kind)}${s.attempt ? " #" + s.attempt : ""}</td>
    <td>${esc(s.agent_id)}</td><td>${s.status ? status(s.status) : ""}</td>
    <td>${s.reason ? `<span class="reason">${esc(s.reason)}</span>` : `<span class="muted">${esc(s.detail)}</span>`}</td></tr>`).join("");
}

function runView(data) {
  const r = data.run || {}, t = data.timeline;
  const span = Math.max(t.end - t.start, 1e-3);
  const waiting = new Set(r.waiting || []);
  const tasks = data.tasks.map((k) => {
    const node = findNode(t.tasks, k.task_id) || {start: t.start, end: t.end};
    const left = ((node.start - t.start) / span) * 100, width = Math.max(((node.end - node.start) / span) * 100, 0.5);
    return `<tr data-task="${esc(k.task_id)}" data-status="${esc(k.status)}">
      <td>${idLink("task", k.task_id)}</td><td>${esc(k.capability)}</td><td>${esc(k.agent_id)}</td>
      <td>${status(k.status)}</td><td>${k.attempts}</td><td class="reason">${esc(k.reason)}</td>
      <td><div class="bar"><span class="s-${esc(k.status)}" style="left:${left}%;width:${width}%"></span></div></td>
      <td>${k.status === "awaiting_approval" || waiting.has(k.task_id) ? buttons(k.task_id) : ""}</td></tr>`;
  }).join("");
  return `<h2>Run <span class="id">${esc(t.root_id)}</span></h2>
    <p id="run-status" data-status="${esc(r.status)}">${status(r.status)} ${r.reason ? `<span class="reason">${esc(r.reason)}</span>` : ""}
    · ${esc(r.goal)} · plan <span class="id">${esc(r.plan_id)}</span> · started ${fmtTime(r.started_at)}
    · ${fmtDur(r.duration_s)} · tasks ${r.tasks_done}/${r.tasks_total} · ${(r.input_tokens + r.output_tokens).toLocaleString()} tokens
    · ${t.events} events</p>
    <h2>Tasks</h2><table id="tasks"><thead><tr><th>task</th><th>capability</th><th>agent</th><th>status</th>
    <th>attempts</th><th>reason</th><th>when</th><th></th></tr></thead><tbody>${tasks}</tbody></table>
    <h2>Timeline</h2><table id="timeline"><thead><tr><th>time</th><th>task</th><th>step</th><th>agent</th>
    <th>status</th><th>reason</th></tr></thead><tbody>${timelineRows(t)}</tbody></table>`;
}
function findNode(nodes, id) {
  for (const n of nodes) { if (n.task_id === id) return n; const c = findNode(n.children, id); if (c) return c; }
  return null;
}

function taskView(data) {
  const k = data.task;
  const steps = data.steps.map((s) => `<tr data-position="${s.position}"><td>${fmtTime(s.time)}</td>
    <td>${esc(s.type)}${s.attempt ? " #" + s.attempt : ""}</td><td>${esc(s.agent_id || s.actor)}</td>
    <td class="reason">${esc(s.reason)}</td>
    <td><details><summary>data</summary>${json(s.data)}</details></td></tr>`).join("");
  return `<h2>Task <span class="id">${esc(k.task_id)}</span></h2>
    <p id="task-status" data-status="${esc(k.status)}">${status(k.status)} · ${esc(k.capability)} · run ${idLink("run", k.root_id)}
    ${k.agent_id ? "· agent " + esc(k.agent_id) : ""} · attempts ${k.attempts}
    ${k.reason ? `· <span class="reason">${esc(k.reason)}</span>` : ""}</p>
    ${k.status === "awaiting_approval" ? `<p>${buttons(k.task_id)}</p>` : ""}
    <h2>Goal</h2><p>${esc(k.goal)}</p>
    <h2>Inputs</h2><div id="task-input">${json(k.input)}</div>
    <h2>Output</h2><div id="task-output">${json(k.output)}</div>
    ${callsTable(data.calls)}
    <h2>Steps</h2><table id="steps"><thead><tr><th>time</th><th>event</th><th>by</th><th>reason</th><th></th></tr></thead>
    <tbody>${steps}</tbody></table>`;
}

function short(v, k) {
  const s = typeof v === "string" ? v : JSON.stringify(v);
  const one = (s || "").split(/\\s+/).join(" ").trim();
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
    : c.status === "open" ? `<span class="reason">no answer recorded</span>`
    : c.status === "unknown" ? `<span class="reason">effect unknown</span>` : `<span class="live">live</span>`;
  const attrs = `data-kind="${esc(c.kind)}" data-attempt="${c.attempt}" data-seq="${c.seq}" data-replayed="${c.replayed_from ? "yes" : "no"}" data-status="${esc(c.kind === "effect_unknown" ? c.decision : c.status)}"`;
  const k = "call-" + c.position;
  if (c.kind === "model") {
    const answer = c.error !== null && c.error !== undefined ? {error: c.error, error_type: c.error_type} : c.answer;
    return `<tr class="call" ${attrs}><td>#${c.seq}</td><td>model <code>${esc(c.response_model || c.model)}</code></td>
      <td>${c.input_tokens}+${c.output_tokens}</td><td>${fmtDur(c.latency_s)}</td><td>${how}</td><td></td>
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

let source = null, sourceKey = null, timer = null, current = null;
function showError(e) { document.getElementById("error").textContent = e ? String(e.message || e) : ""; }
function route() {
  const m = location.hash.match(/^#\\/(run|task)\\/(.+)$/);
  return m ? {view: m[1], id: decodeURIComponent(m[2])} : {view: "runs", id: null};
}
async function refresh() {
  const r = route();
  try {
    let d, html, root = null;
    if (r.view === "run") { d = await getJSON(`/api/runs/${encodeURIComponent(r.id)}`); html = runView(d); root = d.timeline.root_id; }
    else if (r.view === "task") { d = await getJSON(`/api/tasks/${encodeURIComponent(r.id)}`); html = taskView(d); root = d.task.root_id; }
    else { d = await getJSON("/api/runs", {limit: 200}); html = runsView(d); }
    const open = [...document.querySelectorAll("details[open]")].map((d) => d.dataset.key ? "key:" + d.dataset.key : d.closest("tr")?.dataset.position);
    document.getElementById("view").innerHTML = html;
    for (const p of open) {
      const d = p && p.startsWith("key:") ? document.querySelector(`details[data-key="${p.slice(4)}"]`)
        : document.querySelector(`tr[data-position="${p}"] details`);
      d?.setAttribute("open", "");
    }
    document.body.dataset.view = r.view;
    showError(null);
    listen(root, d.position);
  } catch (e) { showError(e); }
}
function schedule() { clearTimeout(timer); timer = setTimeout(refresh, 100); }
function listen(root, position) {
  const key = root || "*";
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
window.addEventListener("hashchange", refresh);
refresh();
</script>
</body>
</html>
"""  # noqa: E501 - the page's lines are HTML and JS, kept as written
