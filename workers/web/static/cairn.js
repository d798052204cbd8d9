// The live part of a page (#live) is fetched again, rendered by the server, every second
// while it can still change; the buttons call the JSON API with the page's session.
"use strict";

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
  const tick = async () => { await refresh(); setTimeout(tick, 1000); };
  setTimeout(tick, 1000);
});
