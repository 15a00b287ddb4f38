"""A self-contained HTML page for a replay timeline: a Gantt chart and the step tables.

The page has no external resources: the timeline is embedded as JSON (every
``<`` escaped, so no data can close the script element) and a small script
draws it with DOM calls and ``textContent`` only, so no value from the log is
ever parsed as HTML.
"""

from __future__ import annotations

import html

import msgspec

from cardbus.eventstore.states import TaskState
from cardbus.projections.replay import Timeline

__all__ = ["COLOURS", "GANTT_JS", "OUTCOMES", "STATUSES", "gantt_css", "legends", "render_html"]

_CSS = """
:root { --fg:#1d232b; --muted:#66707c; --line:#e3e7ec; --bg:#fff; }
* { box-sizing: border-box; }
body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
       background: var(--bg); margin: 24px; }
h1 { font-size: 18px; margin: 0 0 4px; }
h2 { font-size: 15px; margin: 28px 0 6px; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
#summary { color: var(--muted); margin-bottom: 12px; }
.legend span { display: inline-block; margin-right: 12px; }
.legend i { display: inline-block; width: 12px; height: 10px; margin-right: 4px;
            vertical-align: middle; border-radius: 2px; }
#gantt { border: 1px solid var(--line); border-radius: 6px; overflow: hidden; }
.row { display: flex; border-top: 1px solid var(--line); min-height: 28px; }
.row.axis { border-top: none; background: #f7f8fa; }
.label { flex: 0 0 330px; padding: 5px 8px; overflow-wrap: anywhere;
         border-right: 1px solid var(--line); }
.track { position: relative; flex: 1 1 auto; min-width: 400px; }
.tick { position: absolute; top: 0; bottom: 0; border-left: 1px dashed var(--line);
        font-size: 10px; color: var(--muted); padding-left: 2px; }
.taskbar { position: absolute; top: 11px; height: 6px; background: #d5dbe3; border-radius: 3px; }
.span { position: absolute; top: 5px; height: 18px; border-radius: 3px; color: #fff;
        font-size: 10px; padding: 2px 4px; overflow: hidden; white-space: nowrap; min-width: 3px; }
.marker { position: absolute; top: 3px; width: 2px; height: 22px; background: #1d232b;
          opacity: .55; }
.status { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 11px;
          color: #fff; margin-left: 4px; }
table { border-collapse: collapse; width: 100%; margin-bottom: 8px; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid var(--line);
         vertical-align: top; }
th { color: var(--muted); font-weight: 600; }
td.reason { color: #a03a1d; }
td.replayed { color: #8a6d00; } td.live { color: #2e7d32; }
tr.call-attempt th { background: #f7f8fa; color: var(--fg); }
.queued { position: absolute; top: 9px; height: 10px; border-radius: 2px;
          background: repeating-linear-gradient(45deg, #c9d3df 0 3px, #eef2f6 3px 6px); }
details summary { cursor: pointer; color: var(--muted); }
details pre { margin: 4px 0; white-space: pre-wrap; overflow-wrap: anywhere; max-height: 24em;
              overflow: auto; background: #f7f8fa; padding: 4px 6px; border-radius: 4px; }
.legend { margin: 4px 0; } .legend b { margin-right: 8px; color: var(--muted); }
.legend i.queued { position: static; }
.callmark { position: absolute; top: 22px; width: 6px; height: 6px; margin-left: -3px;
            border-radius: 50%; border: 1px solid #fff; }
.call_live { background: #2e7d32; } .call_replayed { background: #c99a00; }
"""

#: every attempt outcome (Gantt bars) and task status, each with its own colour
OUTCOMES = (
    "completed",
    "rejected",
    "timed_out",
    "retry",
    "revision",
    "failed",
    "halted",
    "cancelled",
    "needs_input",
    "awaiting_approval",
    "superseded",
    "open",
)
STATUSES = tuple(s.value for s in TaskState)
COLOURS = {
    "completed": "#2e9d5b",
    "rejected": "#e67e22",
    "timed_out": "#a04000",
    "retry": "#c9a300",
    "revision": "#8e44ad",
    "failed": "#c0392b",
    "halted": "#4a235a",
    "cancelled": "#7f8c8d",
    "needs_input": "#2471a3",
    "awaiting_approval": "#16a085",
    "superseded": "#a9b3bc",
    "open": "#5dade2",
    "pending": "#d98880",
    "dispatched": "#5d6d7e",
    "running": "#1f3a93",
    "needs_revision": "#c39bd3",
}
_CSS += "".join(f".{name} {{ background: {colour}; }}\n" for name, colour in COLOURS.items())

# the rules the Gantt (and its legends) needs, for a page that embeds it (the console)
_GANTT_SELECTORS = (
    ".legend",
    "#gantt",
    ".row",
    ".label",
    ".track",
    ".tick",
    ".taskbar",
    ".span",
    ".marker",
    ".status",
    ".queued",
    ".mono",
    ".callmark",
    ".call_",
)


def gantt_css(scope: str) -> str:
    """The Gantt's CSS rules (bars, queued hatching, outcome and status colours), each
    selector under ``scope`` (a selector of the element holding legends and the Gantt)."""
    out = []
    for rule in _CSS.split("}"):
        if "{" not in rule:
            continue
        selectors, body = rule.split("{", 1)
        names = [x.strip() for x in selectors.split(",")]
        colour = any(x.lstrip(".") in COLOURS for x in names)
        if not colour and not any(x.startswith(_GANTT_SELECTORS) for x in names):
            continue
        scoped = ", ".join(f"{scope} {x}" for x in names)
        out.append(f"{scoped} {{{body}}}")
    return "\n".join(out) + "\n"


def legends() -> str:
    """The legends of the Gantt: attempt outcomes (and queued), task statuses."""
    return (
        _legend("attempts", ("queued", *OUTCOMES), "legend-outcomes")
        + _legend("task status", STATUSES, "legend-statuses")
        + _legend("model and tool calls", ("call_live", "call_replayed"), "legend-calls")
    )


GANTT_JS = r"""
// cardbusGantt(T, el, opts): draw a replay Timeline's Gantt into el (one row per task,
// a hatched queued bar and one bar per attempt, step markers). opts: start/end (the
// axis; default the timeline's), link(task_id) (an href for each task id).
function cardbusGantt(T, gantt, opts) {
  opts = opts || {};
  const $ = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  };
  const fmtDur = (s) => s == null ? "" : s < 1 ? (s * 1000).toFixed(0) + " ms"
    : s < 120 ? s.toFixed(2) + " s" : (s / 60).toFixed(1) + " min";
  const rows = [];
  const roundOf = {};  // review subtask id -> its round among the parent's reviews
  const walk = (n, d) => {
    rows.push([d, n]);
    let k = 0;
    (n.children || []).forEach((c) => { if (c.role === "review") roundOf[c.task_id] = ++k; });
    (n.steps || []).forEach((s) => {
      const p = s.payload;
      if (p && p.reviewer_task_id) roundOf[p.reviewer_task_id] = p.round;
    });
    (n.children || []).forEach((c) => walk(c, d + 1));
  };
  const name = (n) => (n.capability || "?") +
    (roundOf[n.task_id] ? " round " + roundOf[n.task_id] : "");
  (T.tasks || []).forEach((n) => walk(n, 0));
  const start = opts.start != null ? opts.start : T.start;
  const axisEnd = opts.end != null ? opts.end : T.end;
  const span = Math.max(axisEnd - start, 1e-3);
  const pct = (t) => (100 * (t - start) / span).toFixed(3) + "%";
  const width = (a, b) => Math.max(100 * (b - a) / span, 0.25).toFixed(3) + "%";
  const axis = $("div", "row axis");
  axis.appendChild($("div", "label", "task"));
  const axisTrack = $("div", "track");
  for (let i = 0; i <= 4; i++) {
    const tk = $("div", "tick", "+" + fmtDur(span * i / 4));
    tk.style.left = (i * 25) + "%";
    if (i === 4) { tk.style.left = "auto"; tk.style.right = "0"; }
    axisTrack.appendChild(tk);
  }
  axis.appendChild(axisTrack);
  gantt.appendChild(axis);

  if (T.run && T.run.length) {
    const row = $("div", "row run");
    row.dataset.task = T.root_id;
    row.appendChild($("div", "label", "run " + T.root_id));
    const track = $("div", "track");
    T.run.forEach((s) => {
      const m = $("div", "marker");
      m.style.left = pct(s.time);
      m.title = s.kind + " @ " + s.at + (s.reason ? " \u2014 " + s.reason : "");
      track.appendChild(m);
    });
    row.appendChild(track);
    gantt.appendChild(row);
  }

  rows.forEach(([depth, n]) => {
    const row = $("div", "row task");
    row.dataset.task = n.task_id;
    const label = $("div", "label");
    label.style.paddingLeft = (8 + depth * 18) + "px";
    label.appendChild($("span", "mono", (depth ? "\u21b3 " : "") + name(n) + " "));
    const idEl = $("span", "mono task-id", n.task_id);
    if (opts.link) {
      const link = $("a");
      link.href = opts.link(n.task_id);
      link.appendChild(idEl);
      label.appendChild(link);
    } else label.appendChild(idEl);
    label.appendChild($("span", "status " + (n.status || "open"), n.status || "?"));
    label.title = n.task_id + (n.reason ? " \u2014 " + n.reason : "");
    row.appendChild(label);
    const track = $("div", "track");
    const bar = $("div", "taskbar");
    bar.style.left = pct(n.start);
    bar.style.width = width(n.start, n.end);
    track.appendChild(bar);
    (n.spans || []).forEach((s) => {
      const end = s.end == null ? axisEnd : s.end;
      if (s.queued_s) {
        const q = $("div", "queued");
        q.style.left = pct(s.start - s.queued_s);
        q.style.width = width(s.start - s.queued_s, s.start);
        q.title = "attempt " + s.attempt + " queued " + fmtDur(s.queued_s);
        q.dataset.attempt = s.attempt;
        track.appendChild(q);
      }
      const e = $("div", "span " + s.outcome, "#" + s.attempt + " " + s.agent_id);
      e.style.left = pct(s.start);
      e.style.width = width(s.start, end);
      e.dataset.outcome = s.outcome;
      e.dataset.attempt = s.attempt;
      e.title = "attempt " + s.attempt + " by " + s.agent_id + ": " + s.outcome + " after " +
        fmtDur(end - s.start) + (s.queued_s != null ? ", queued " + fmtDur(s.queued_s) : "") +
        (s.run_s != null ? ", ran " + fmtDur(s.run_s) : "") +
        (s.input_tokens || s.output_tokens ? ", " + s.input_tokens + "+" + s.output_tokens +
          " tokens" : "") + (s.model ? ", " + s.model : "") +
        (s.reason ? " \u2014 " + s.reason : "");
      track.appendChild(e);
      // a dot per model or tool call of the attempt, at its start: live, or replayed
      // from the journal (answered from the log, nothing paid for, no effect repeated)
      (s.calls || []).forEach((c) => {
        if (c.kind !== "model" && c.kind !== "tool") return;
        const how = c.replayed_from ? "replayed" : "live";
        const m = $("div", "callmark call_" + how);
        m.style.left = pct(c.start);
        m.dataset.kind = c.kind;
        m.dataset.replayed = c.replayed_from ? "yes" : "no";
        m.title = (c.kind === "model" ? "model " + (c.response_model || c.model)
          : "tool " + c.tool) + " (call #" + c.seq + ", attempt " + s.attempt + "): " +
          (c.replayed_from ? "replayed from " + c.replayed_from : "live");
        track.appendChild(m);
      });
    });
    (n.steps || []).forEach((s) => {
      const m = $("div", "marker");
      m.style.left = pct(s.time);
      m.title = s.kind + " @ " + s.at + (s.reason ? " \u2014 " + s.reason : "");
      track.appendChild(m);
    });
    row.appendChild(track);
    gantt.appendChild(row);
  });

  return {rows: rows, name: name, start: start};
}
"""

_JS = r"""
(function () {
  const T = JSON.parse(document.getElementById("timeline-data").textContent);
  const $ = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  };
  const fmtDur = (s) => s == null ? "" : s < 1 ? (s * 1000).toFixed(0) + " ms"
    : s < 120 ? s.toFixed(2) + " s" : (s / 60).toFixed(1) + " min";
  const fmtTime = (t) => new Date(t * 1000).toISOString().replace("T", " ").replace("Z", "");
  const G = cardbusGantt(T, document.getElementById("gantt"));
  const rows = G.rows, name = G.name, start = G.start;
  const pretty = (v) => JSON.stringify(v, null, 2);
  const fold = (summary, value) => {  // collapsed by default
    const d = $("details", "payload");
    d.appendChild($("summary", null, summary));
    d.appendChild($("pre", "mono", pretty(value)));
    return d;
  };
  document.getElementById("title").textContent =
    "Replay of " + (T.id === T.root_id ? "run " : "task ") + T.id;
  const bad = ["failed", "halted", "cancelled"];
  const failed = rows.filter(([, n]) => bad.includes(n.status)).length;
  document.getElementById("summary").textContent =
    rows.length + " tasks \u00b7 " + T.events + " events \u00b7 " + fmtDur(T.duration_s) +
    " \u00b7 " + failed + " failed or halted \u00b7 root " + T.root_id +
    (T.as_of ? " \u00b7 as of " + T.as_of : "");

  const details = document.getElementById("details");
  const cols = ["time", "+", "duration", "step", "attempt", "agent", "status", "reason / detail",
    "data"];
  const acols = ["attempt", "agent", "model", "outcome", "queued", "ran", "dispatch \u2192 result",
    "tokens in", "tokens out", "output"];
  const attempts = (n) => {
    const t = $("table", "attempts");
    t.dataset.task = n.task_id;
    const head = $("tr");
    acols.forEach((c) => head.appendChild($("th", null, c)));
    t.appendChild(head);
    n.spans.forEach((s) => {
      const tr = $("tr", "attempt");
      tr.dataset.attempt = s.attempt;
      tr.appendChild($("td", null, s.attempt));
      tr.appendChild($("td", null, s.agent_id));
      tr.appendChild($("td", "model", s.model || "\u2014"));
      const o = $("td"); o.appendChild($("span", "status " + s.outcome, s.outcome));
      tr.appendChild(o);
      tr.appendChild($("td", "mono queue", fmtDur(s.queued_s)));
      tr.appendChild($("td", "mono run", fmtDur(s.run_s)));
      tr.appendChild($("td", "mono", fmtDur(s.latency_s)));
      tr.appendChild($("td", "mono tokens-in", s.input_tokens));
      tr.appendChild($("td", "mono tokens-out", s.output_tokens));
      const out = $("td");
      if (s.output !== null && s.output !== undefined) out.appendChild(fold("output", s.output));
      tr.appendChild(out);
      t.appendChild(tr);
    });
    details.appendChild(t);
    calls(n);
  };
  // the journal: each attempt's model calls, tool calls and unknown effects
  const short = (v, k) => {
    const s = typeof v === "string" ? v : JSON.stringify(v);
    const one = (s || "").replace(/\s+/g, " ").trim();
    return one.length > (k || 60) ? one.slice(0, (k || 60) - 1) + "\u2026" : one;
  };
  const promptText = (c) => {
    const r = c.prompt;
    if (r == null) return "(not kept: sha256 " + (c.request_digest || "").slice(0, 12) + ")";
    const m = r.messages;
    if (Array.isArray(m) && m.length && typeof m[m.length - 1].content === "string") {
      return short(m[m.length - 1].content);
    }
    return short(typeof r.prompt === "string" ? r.prompt : r);
  };
  const answerText = (c) => {
    if (c.error != null) return "error " + (c.error_type || "") + ": " + short(c.error);
    const a = c.answer;
    if (a == null) return c.status === "open" ? "(no answer recorded)" : "(not kept)";
    if (typeof a.text === "string" && a.text) return short(a.text);
    if (Array.isArray(a.tool_calls) && a.tool_calls.length) {
      return "tool calls: " + a.tool_calls.map((t) => t.name || (t.function || {}).name).join(", ");
    }
    return short(a);
  };
  const ccols = ["call", "kind", "model / tool", "tokens", "latency", "live / replayed",
    "key / decision", "prompt / arguments", "answer / result"];
  const calls = (n) => {
    const all = [];
    (n.spans || []).forEach((s) => (s.calls || []).forEach((c) => all.push([s, c])));
    (n.calls || []).forEach((c) => all.push([null, c]));
    if (!all.length) return;
    const t = $("table", "calls");
    t.dataset.task = n.task_id;
    const head = $("tr");
    ccols.forEach((c) => head.appendChild($("th", null, c)));
    t.appendChild(head);
    let last;
    all.forEach(([s, c]) => {
      if (s !== last) {
        last = s;
        const g = $("tr", "call-attempt");
        g.dataset.attempt = s ? s.attempt : "";
        const td = $("th", null, s ? "attempt #" + s.attempt + " \u2014 " + s.agent_id +
          " (" + s.outcome + ")" : "outside the attempts shown");
        td.colSpan = ccols.length;
        g.appendChild(td);
        t.appendChild(g);
      }
      const tr = $("tr", "call k-" + c.kind);
      tr.dataset.kind = c.kind;
      tr.dataset.attempt = c.attempt;
      tr.dataset.seq = c.seq;
      tr.dataset.replayed = c.replayed_from ? "yes" : "no";
      tr.dataset.status = c.kind === "effect_unknown" ? c.decision : c.status;
      const how = c.replayed_from ? "replayed from " + c.replayed_from
        : c.status === "open" ? "no answer recorded"
        : c.status === "unknown" ? "effect unknown" : "live";
      const cell = (cls, v) => tr.appendChild($("td", cls, v));
      const folded = (summary, value) => {
        const td = $("td");
        const d = $("details", "payload");
        d.appendChild($("summary", null, summary));
        d.appendChild($("pre", "mono", pretty(value)));
        td.appendChild(d);
        tr.appendChild(td);
      };
      cell("mono", "#" + c.seq);
      if (c.kind === "model") {
        cell(null, "model");
        cell("mono", c.response_model || c.model);
        cell("mono tokens", c.input_tokens + "+" + c.output_tokens);
        cell("mono", fmtDur(c.latency_s));
        cell(c.replayed_from ? "replayed" : "live", how);
        cell("mono", "");
        folded(promptText(c), c.prompt);
        folded(answerText(c), c.error != null ? {error: c.error, error_type: c.error_type}
          : c.answer);
      } else if (c.kind === "tool") {
        cell(null, "tool");
        cell("mono", c.tool);
        cell("mono", "");
        cell("mono", fmtDur(c.duration_s));
        cell(c.replayed_from ? "replayed" : "live", how);
        cell("mono key", c.idempotency_key);
        folded(short(c.arguments, 40), c.arguments);
        if (c.error != null) folded("error " + (c.error_type || "") + ": " + short(c.error, 40),
          {error: c.error, error_type: c.error_type});
        else if (c.end == null) cell("reason", "no result recorded");
        else folded(short(c.result, 40), c.result);
      } else {
        cell("reason", "effect unknown");
        cell("mono", c.tool);
        cell("mono", "");
        cell("mono", "");
        cell(null, "");
        cell("mono decision", "decision " + c.decision + ", key " + c.idempotency_key);
        cell("mono", "call " + c.requested_event_id);
        cell(null, c.decision === "ask" ? "asks an operator before repeating"
          : "repeated with the same key");
      }
      t.appendChild(tr);
    });
    details.appendChild(t);
  };
  const table = (title, steps, id, n) => {
    const h = $("h2", null, title);
    details.appendChild(h);
    if (n) {
      const io = $("div", "io");
      io.dataset.task = n.task_id;
      io.appendChild(fold("inputs", n.inputs == null ? {} : n.inputs));
      if (n.deps && n.deps.length) io.appendChild($("div", "mono", "after " + n.deps.join(", ")));
      if (n.output !== null && n.output !== undefined) io.appendChild(fold("output", n.output));
      details.appendChild(io);
      if (n.spans && n.spans.length) attempts(n); else calls(n);
    }
    const t = $("table", "steps");
    t.dataset.task = id;
    const head = $("tr");
    cols.forEach((c) => head.appendChild($("th", null, c)));
    t.appendChild(head);
    steps.forEach((s) => {
      const tr = $("tr", "step k-" + s.kind.replace(/[^a-z_]/g, "_"));
      tr.appendChild($("td", "mono", fmtTime(s.time)));
      tr.appendChild($("td", "mono", "+" + fmtDur(s.time - start)));
      tr.appendChild($("td", "mono", fmtDur(s.duration_s)));
      tr.appendChild($("td", null, s.kind));
      tr.appendChild($("td", null, s.attempt == null ? "" : s.attempt));
      tr.appendChild($("td", null, s.agent_id || ""));
      tr.appendChild($("td", null, s.status || ""));
      tr.appendChild($("td", s.reason ? "reason" : null, s.reason || s.detail || ""));
      const data = $("td");
      if (s.payload !== null && s.payload !== undefined) data.appendChild(fold("data", s.payload));
      tr.appendChild(data);
      t.appendChild(tr);
    });
    details.appendChild(t);
  };
  if (T.run && T.run.length) table("run " + T.root_id, T.run, T.root_id);
  rows.forEach(([, n]) => table(name(n) + " \u2014 " + n.task_id + " (" +
    (n.status || "?") + ")", n.steps || [], n.task_id, n));
  document.body.dataset.rendered = "yes";
})();
"""


def _legend(title: str, names: tuple[str, ...], id: str) -> str:
    items = "".join(f"<span><i class='{c}'></i>{c.replace('_', ' ')}</span>" for c in names)
    return f"<div class='legend' id='{id}'><b>{title}</b>{items}</div>"


def render_html(timeline: Timeline) -> str:
    """The whole page as one string (no external resources)."""
    data = msgspec.json.encode(timeline).decode()
    data = data.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    title = html.escape(f"cardbus replay {timeline.id}")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title}</title>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1 id='title'>{title}</h1><div id='summary'>This page needs JavaScript.</div>"
        + legends()
        + "<h2>Timeline</h2><div id='gantt'></div><div id='details'></div>"
        f"<script id='timeline-data' type='application/json'>{data}</script>"
        f"<script>{GANTT_JS}{_JS}</script></body></html>\n"
    )
