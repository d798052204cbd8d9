// The live part of a page (#live) is fetched again, rendered by the server, every second
// while it can still change; the buttons call the JSON API with the page's session. The
// run page's Live panel (#stream) follows the run's events instead: see watch().
// Every script of the pages is in this file: their Content-Security-Policy runs no inline
// script or style, so the timeline's bars are placed from their data attributes here.
"use strict";

// The timeline's bars, gaps and ticks: left and width in % of the run, from data-left
// and data-width (a style attribute in the markup would be an inline style).
function place(root) {
  root.querySelectorAll("[data-left]").forEach((node) => {
    node.style.left = node.dataset.left + "%";
    if (node.dataset.width !== undefined) node.style.width = node.dataset.width + "%";
  });
}

const PAGE = { "X-Cairn-Page": "1", "Content-Type": "application/json" };

async function refresh() {
  const live = document.getElementById("live");
  if (!live || live.dataset.live !== "true") return;
  const url = new URL(location.href);
  url.searchParams.set("partial", "1");
  try {
    const response = await fetch(url, { credentials: "same-origin" });
    if (response.ok) {
      const open = [...live.querySelectorAll("details[open] > summary")].map((s) => s.textContent);
      live.outerHTML = await response.text();
      place(document.getElementById("live") || document);
      document.querySelectorAll("#live details > summary").forEach((s) => {
        if (open.includes(s.textContent)) s.parentElement.open = true;
      });
      const now = document.getElementById("live");
      const cancel = document.getElementById("cancel");
      if (cancel && now && now.dataset.live !== "true") cancel.disabled = true;
    }
  } catch (e) {
    // The server restarting is no reason to stop watching.
  }
}

function say(text, bad) {
  const box = document.getElementById("action-message");
  if (box) {
    box.textContent = text;
    box.className = bad ? "bad" : "muted";
  }
}

async function post(url, body) {
  const response = await fetch(url, {
    method: "POST", headers: PAGE, credentials: "same-origin", body: JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error((data.error && data.error.message) || response.statusText);
  return data;
}

document.addEventListener("DOMContentLoaded", () => {
  place(document);
  const actions = document.querySelector(".actions[data-run]");
  if (actions) {
    const runId = actions.dataset.run;
    const base = "/runs/" + encodeURIComponent(runId);
    document.getElementById("cancel").addEventListener("click", async (event) => {
      if (!confirm("Cancel run " + runId + "? It stops at its next step boundary.")) return;
      event.target.disabled = true;
      try {
        const run = await post(base + "/cancel", { reason: "cancelled from the web page" });
        say("cancel asked: the run is " + run.status);
      } catch (e) {
        event.target.disabled = false;
        say("cancel failed: " + e.message, true);
      }
      refresh();
    });
    // "fork from here" on a saved step: a new run from the checkpoint it saved.
    document.addEventListener("click", async (event) => {
      const button = event.target.closest ? event.target.closest(".fork-here") : null;
      if (!button) return;
      const seq = Number(button.dataset.seq);
      if (!confirm("Start a new run from " + runId + " at seq " + seq + "? The run itself is not touched.")) return;
      try {
        const run = await post(base + "/fork", { at_seq: seq });
        window.location.href = "/ui/runs/" + encodeURIComponent(run.run_id);
      } catch (e) {
        say("fork failed: " + e.message, true);
      }
    });
    document.getElementById("signal-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      const form = event.target;
      let payload = null;
      try {
        payload = form.payload.value.trim() ? JSON.parse(form.payload.value) : null;
      } catch (e) {
        say("the payload is not JSON: " + e.message, true);
        return;
      }
      try {
        const out = await post(base + "/signals/" + encodeURIComponent(form.event.value), { payload });
        say(out.stored ? "signal " + form.event.value + " sent" : "that signal was already sent");
        form.closest("details").open = false;
      } catch (e) {
        say("signal failed: " + e.message, true);
      }
      refresh();
    });
  }
  // The approvals page: each answer is logged, a refused one (409: decided already, or
  // its run no longer waits) in words, so a double click says what happened.
  const decisions = document.getElementById("decisions");
  if (decisions) {
    document.addEventListener("click", async (event) => {
      const button = event.target.closest ? event.target.closest("button.decide") : null;
      if (!button) return;
      const id = button.dataset.approval, decision = button.dataset.decision;
      const line = (text, bad) => decisions.append(el("li", bad ? "bad" : "ok", text));
      try {
        const got = await post("/approvals/" + encodeURIComponent(id) + "/decision", { decision });
        line(`approval ${id}: ${decision} sent to run ${got.run_id}`);
      } catch (e) {
        line(`approval ${id}: ${decision} refused: ${e.message}`, true);
      }
      refresh();
    });
  }
  const panel = document.getElementById("stream");
  if (panel && window.EventSource) watch(panel);
  const tick = async () => { await refresh(); setTimeout(tick, 1000); };
  setTimeout(tick, 1000);
});

// -- the Live panel: GET /runs/{id}/events as Server-Sent Events -------------------------
// Model text grows token by token in one block per step attempt (cursor, visit, attempt).
// An attempt cut by a lost worker or a retry stays visible, struck through, and the next
// attempt's text starts fresh below it. Event data only ever reaches the page as text.

const FEED_MAX = 300; // newest entries kept: a long run must not grow the page for ever
// EventSource hands a named event only to listeners of that name: these are cairn's own
// kinds. A step's own (ctx.emit) come unnamed, to onmessage, with their kind in the data.
const KINDS = ["step_started", "token", "model_restart", "message", "call", "step_saved",
  "retry", "attempt_abandoned", "wait", "resumed", "run_ended", "dropped", "gap"];

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function short(value, max = 160) {
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return text === undefined ? "" : text.length > max ? text.slice(0, max - 1) + "…" : text;
}

function clock(ts) {
  const d = new Date(ts * 1000);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

// One line of the feed per event but tokens: what it says, in a few words.
function detail(e) {
  const d = e.data || {};
  switch (e.kind) {
    case "message": {
      const tools = (d.tool_calls || []).map((t) => t.name).join(", ");
      return `call ${d.call}: ${(d.text || "").length} chars` + (tools ? `, tools: ${tools}` : "") +
        (d.replayed ? " (replayed from the journal)" : "");
    }
    case "call": return `call ${d.call} ${d.name}: ` + (d.error ? "error: " + d.error : short(d.result));
    case "step_saved": return d.next ? "next: " + d.next : "";
    case "retry": return short(d.error || "");
    case "attempt_abandoned": return `${d.cursor} visit ${d.visit} attempt ${d.attempt}: worker lost`;
    case "resumed": return d.reason || "";
    case "run_ended": return d.status + (d.error ? ": " + short(d.error) : "");
    case "dropped": return `${d.count || "?"} event(s): ${d.reason || ""}`;
    case "gap": return (d.reason || "") + "; the durable record follows";
    case "model_restart": return `call ${d.call}: the model was asked again`;
    default: return Object.keys(d).length ? short(d) : "";
  }
}

function watch(panel) {
  const attempts = document.getElementById("attempts");
  const feed = document.getElementById("feed");
  const state = document.getElementById("stream-state");
  const open = new Map(); // "cursor|visit|attempt": its block, until it is cut
  const source = new EventSource("/runs/" + encodeURIComponent(panel.dataset.run) + "/events");
  const show = (what) => { panel.dataset.state = what; state.textContent = what; };
  const key = (cursor, visit, attempt) => `${cursor}|${visit}|${attempt}`;

  function block(e) {
    const k = key(e.cursor, e.visit, e.attempt);
    let b = open.get(k);
    if (!b) {
      b = el("div", "attempt");
      Object.assign(b.dataset, { cursor: e.cursor ?? "", visit: e.visit ?? "", attempt: e.attempt ?? "", state: "streaming" });
      const head = el("div", "attempt-head");
      head.append(el("span", "mono", e.cursor || "run"),
        el("span", "muted small", ` visit ${e.visit ?? "?"} · attempt ${e.attempt ?? "?"}`),
        el("span", "tag", "streaming"));
      b.append(head);
      attempts.append(b);
      open.set(k, b);
    }
    return b;
  }

  function text(e) {
    const b = block(e);
    const call = String(e.data.call);
    let t = [...b.querySelectorAll("pre.text")].find((p) => p.dataset.call === call);
    if (!t) {
      t = el("pre", "text");
      t.dataset.call = call;
      b.append(t);
    }
    return t;
  }

  // Its events no longer stand: a later attempt does the step again.
  function cut(cursor, visit, attempt, why) {
    const k = key(cursor, visit, attempt);
    const b = open.get(k);
    if (!b) return;
    open.delete(k); // a token of the same envelope after this starts a new block
    b.classList.add("cut");
    b.dataset.state = "cut";
    b.dataset.cut = why;
    b.querySelector(".tag").textContent = "cut: " + why;
  }

  // Its events stand: the step's checkpoint committed.
  function saved(b, label) {
    if (!b) return;
    b.dataset.state = "saved";
    b.classList.add("saved");
    b.querySelector(".tag").textContent = label;
  }

  function log(e) {
    const item = el("li", "ev ev-" + e.kind);
    item.dataset.kind = e.kind;
    const where = e.cursor ? `${e.cursor} v${e.visit ?? "?"}` + (e.attempt != null ? ` a${e.attempt}` : "") : "";
    item.append(el("span", "time", e.ts ? clock(e.ts) : ""), el("span", "kind", e.kind),
      el("span", "where", where), el("span", "what", detail(e)));
    const follow = feed.scrollTop + feed.clientHeight >= feed.scrollHeight - 4;
    feed.append(item);
    while (feed.childElementCount > FEED_MAX) feed.firstElementChild.remove();
    if (follow) feed.scrollTop = feed.scrollHeight;
  }

  function handle(e) {
    const d = e.data || {};
    if (e.kind === "token") {
      text(e).append(d.text); // a text node: never parsed as HTML
      return;
    }
    log(e);
    if (e.kind === "model_restart") text(e).textContent = "";
    else if (e.kind === "message") {
      text(e).textContent = d.text || ""; // the whole answer wins over the tokens
      // After a gap the record names no attempt: what it says was saved.
      if (e.durable) saved(open.get(key(e.cursor, e.visit, e.attempt)), "journaled");
    } else if (e.kind === "retry") cut(e.cursor, e.visit, e.attempt, "retried");
    else if (e.kind === "attempt_abandoned") cut(d.cursor, d.visit, d.attempt, "worker lost");
    else if (e.kind === "step_saved") saved(open.get(key(e.cursor, e.visit, e.attempt)), "saved");
    else if (e.kind === "run_ended") {
      source.close(); // the last event: the browser would otherwise reconnect
      panel.dataset.ended = d.status;
      show("ended: " + d.status);
      refresh();
    }
  }

  for (const kind of KINDS) {
    source.addEventListener(kind, (m) => {
      try {
        handle(JSON.parse(m.data));
      } catch (err) {
        console.error("cairn: event not shown", kind, err);
      }
    });
  }
  source.onmessage = (m) => {
    try {
      handle(JSON.parse(m.data));
    } catch (err) {
      console.error("cairn: event not shown", err);
    }
  };
  source.onopen = () => show("live");
  source.onerror = () => {
    if (panel.dataset.ended) return;
    // CONNECTING: the browser tries again with Last-Event-ID; CLOSED: it gave up (an HTTP error).
    show(source.readyState === EventSource.CLOSED ? "closed: reload the page to follow again" : "reconnecting…");
  };
}
