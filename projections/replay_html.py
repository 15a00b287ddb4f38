"""A self-contained HTML page for a replay timeline: a Gantt chart and the step tables.

The page has no external resources: the timeline is embedded as JSON (every
``<`` escaped, so no data can close the script element) and a small script
draws it with DOM calls and ``textContent`` only, so no value from the log is
ever parsed as HTML.
"""

from __future__ import annotations

import html

import msgspec

from cardbus.projections.replay import Timeline

__all__ = ["render_html"]

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
.label { flex: 0 0 330px; padding: 5px 8px; white-space: nowrap; overflow: hidden;
         text-overflow: ellipsis; border-right: 1px solid var(--line); }
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
.completed { background: #2e9d5b; } .rejected { background: #d9822b; }
.timed_out { background: #c0392b; } .failed { background: #c0392b; }
.retry { background: #e0a526; } .revision { background: #8e44ad; }
.halted { background: #6c3483; } .cancelled { background: #7f8c8d; }
.needs_input { background: #2980b9; } .awaiting_approval { background: #16a085; }
.open, .running, .dispatched, .pending { background: #3d7edb; }
.superseded { background: #95a5a6; } .needs_revision { background: #8e44ad; }
table { border-collapse: collapse; width: 100%; margin-bottom: 8px; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid var(--line);
         vertical-align: top; }
th { color: var(--muted); font-weight: 600; }
td.reason { color: #a03a1d; }
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
  const rows = [];
  const walk = (n, d) => { rows.push([d, n]); (n.children || []).forEach((c) => walk(c, d + 1)); };
  (T.tasks || []).forEach((n) => walk(n, 0));
  const start = T.start, span = Math.max(T.end - T.start, 1e-3);
  const pct = (t) => (100 * (t - start) / span).toFixed(3) + "%";
  const width = (a, b) => Math.max(100 * (b - a) / span, 0.25).toFixed(3) + "%";

  document.getElementById("title").textContent =
    "Replay of " + (T.id === T.root_id ? "run " : "task ") + T.id;
  const bad = ["failed", "halted", "cancelled"];
  const failed = rows.filter(([, n]) => bad.includes(n.status)).length;
  document.getElementById("summary").textContent =
    rows.length + " tasks \u00b7 " + T.events + " events \u00b7 " + fmtDur(T.duration_s) +
    " \u00b7 " + failed + " failed or halted \u00b7 root " + T.root_id +
    (T.as_of ? " \u00b7 as of " + T.as_of : "");

  const gantt = document.getElementById("gantt");
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
    label.appendChild($("span", "mono", (depth ? "\u21b3 " : "") + (n.capability || "?") + " "));
    label.appendChild($("span", "mono", n.task_id.slice(0, 12)));
    label.appendChild($("span", "status " + (n.status || "open"), n.status || "?"));
    label.title = n.task_id + (n.reason ? " \u2014 " + n.reason : "");
    row.appendChild(label);
    const track = $("div", "track");
    const bar = $("div", "taskbar");
    bar.style.left = pct(n.start);
    bar.style.width = width(n.start, n.end);
    track.appendChild(bar);
    (n.spans || []).forEach((s) => {
      const end = s.end == null ? T.end : s.end;
      const e = $("div", "span " + s.outcome, "#" + s.attempt + " " + s.agent_id);
      e.style.left = pct(s.start);
      e.style.width = width(s.start, end);
      e.dataset.outcome = s.outcome;
      e.title = "attempt " + s.attempt + " by " + s.agent_id + ": " + s.outcome + " after " +
        fmtDur(end - s.start) + (s.reason ? " \u2014 " + s.reason : "");
      track.appendChild(e);
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

  const details = document.getElementById("details");
  const cols = ["time", "+", "duration", "step", "attempt", "agent", "status", "reason / detail"];
  const table = (title, steps, id) => {
    const h = $("h2", null, title);
    details.appendChild(h);
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
      t.appendChild(tr);
    });
    details.appendChild(t);
  };
  if (T.run && T.run.length) table("run " + T.root_id, T.run, T.root_id);
  rows.forEach(([, n]) => table((n.capability || "?") + " \u2014 " + n.task_id + " (" +
    (n.status || "?") + ")", n.steps || [], n.task_id));
  document.body.dataset.rendered = "yes";
})();
"""


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
        "<div class='legend'>"
        + "".join(
            f"<span><i class='{c}'></i>{c.replace('_', ' ')}</span>"
            for c in (
                "completed",
                "rejected",
                "timed_out",
                "retry",
                "revision",
                "failed",
                "halted",
                "open",
            )
        )
        + "</div><h2>Timeline</h2><div id='gantt'></div><div id='details'></div>"
        f"<script id='timeline-data' type='application/json'>{data}</script>"
        f"<script>{_JS}</script></body></html>\n"
    )
