// The live example's script (live.html), a module of its own: the page's
// Content-Security-Policy runs no inline script. Copy both into your app.
// The events URL with its read token, from the back end (POST /runs/{id}/events/token).
const url = new URLSearchParams(location.search).get("events");
const blocks = new Map(); // one per step attempt: cursor, visit, attempt (its lease epoch)
const $ = (id) => document.getElementById(id);
$("run").textContent = decodeURIComponent(url.split("/")[2]);

function block(cursor, visit, attempt) {
  const key = `${cursor}/${visit}/${attempt}`;
  if (!blocks.has(key)) {
    const div = document.createElement("div");
    Object.assign(div.dataset, { cursor, visit, attempt, state: "live" });
    div.className = "attempt";
    div.innerHTML = '<div class="why"></div><pre class="text"></pre>';
    div.querySelector(".why").textContent = `${cursor}, attempt ${attempt}`;
    $("attempts").append(div);
    blocks.set(key, div);
  }
  return blocks.get(key);
}
const of = (e) => block(e.cursor, e.visit, e.attempt);
function cut(div, why) {
  div.classList.add("cut");
  div.dataset.state = "cut";
  div.querySelector(".why").textContent += ` — cut: ${why}`;
}

const source = new EventSource(url);
source.onopen = () => ($("state").textContent = "live");
source.onerror = () => ($("state").textContent = "reconnecting"); // it retries by itself
const on = {
  // A text delta: shown as text, never as markup.
  token: (e) => (of(e).querySelector(".text").textContent += e.data.text),
  // The streamed call was retried: its tokens so far are void.
  model_restart: (e) => (of(e).querySelector(".text").textContent = ""),
  // The whole answer, once journaled (or told from Postgres after a gap).
  message: (e) => (of(e).querySelector(".text").textContent = e.data.text),
  step_saved: (e) => (of(e).dataset.state = "saved"),
  retry: (e) => cut(of(e), "retried"),
  // The worker running it was lost: the next attempt answers again.
  attempt_abandoned: (e) => cut(block(e.data.cursor, e.data.visit, e.data.attempt), "worker lost"),
  run_ended: (e) => {
    $("status").textContent = e.data.status;
    $("state").textContent = "ended";
    source.close(); // else EventSource would reconnect to a stream that has ended
  },
};
for (const [kind, show] of Object.entries(on)) {
  // cairn's own kinds come named; the data is one JSON event (the Event schema).
  source.addEventListener(kind, (message) => show(JSON.parse(message.data)));
}
