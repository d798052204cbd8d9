/**
 * The client end to end, against `cairn serve` and a worker with the demo's invoice
 * workflow (CAIRN_WORKFLOWS=cairn.testing.demos.invoice on both):
 *
 *   CAIRN_URL=http://127.0.0.1:8000 CAIRN_API_TOKEN=... node dist/example.js order-77
 *
 * It enqueues an invoice that waits for its payment (twice, under one Idempotency-Key:
 * one run), steers it, signals the payment, waits for the result, reads the step history and the
 * journaled calls, cancels a second run, reads the approvals inbox, and prints one JSON line
 * of what it saw.
 */
import { Cairn, CairnError, type Run } from "./cairn.js";

const cairn = new Cairn(
  process.env.CAIRN_URL ?? "http://127.0.0.1:8000",
  process.env.CAIRN_API_TOKEN ?? "",
);
const orderId = process.argv[2] ?? `order-${Date.now()}`;
const input = { customer: "acme", email: "ap@acme.test", await_payment: true };

const run: Run = await cairn.enqueue("invoice", input, { idempotencyKey: orderId });
const again = await cairn.enqueue("invoice", input, { idempotencyKey: orderId });
console.error(`enqueued ${run.run_id} (${run.status}); again: ${again.run_id}`);

const waiting = await cairn.wait(run.run_id, { until: (r) => r.status === "waiting" });
// A message for the agent, read at its next ctx.messages() (the invoice reads none).
const steered = await cairn.steer(run.run_id, "also check the invoice date");
const signalled = await cairn.signal(run.run_id, "payment", { amount_cents: 4200 }, "pay-1");
const twice = await cairn.signal(run.run_id, "payment", { amount_cents: 4200 }, "pay-1");
const done = await cairn.wait(run.run_id);
const steps = await cairn.history(run.run_id);
const calls = await cairn.calls(run.run_id);
for (const step of steps) {
  console.error(`#${step.seq} ${step.cursor}: ${step.outcome} in ${step.seconds.toFixed(3)} s`);
}

// For the user's browser: the run's events, readable with this token only (no API token).
const live = await cairn.eventsToken(run.run_id);

const other = await cairn.enqueue("invoice", input, { idempotencyKey: `${orderId}-cancelled` });
const cancelled = await cairn.cancel(other.run_id, "customer closed the account");

let missing = "";
try {
  await cairn.get(`${orderId}-no-such-run`);
} catch (err) {
  if (!(err instanceof CairnError)) throw err;
  missing = `${err.status} ${err.type}`;
}

// The approvals inbox: the invoice's payment wait asks no person, so nothing is listed.
const inbox = await cairn.approvals({ workflow: "invoice", order: "oldest" });
let undecided = "";
try {
  await cairn.decide(999999, { decision: "approve" });
} catch (err) {
  if (!(err instanceof CairnError)) throw err;
  undecided = `${err.status} ${err.type}`;
}

console.log(
  JSON.stringify({
    run_id: run.run_id,
    same_run: again.run_id === run.run_id,
    waited_for: waiting.status,
    stored: [signalled.stored, twice.stored],
    steered: steered.n,
    status: done.status,
    state: done.state,
    cost_usd: done.cost_usd,
    steps: steps.map((s) => [s.cursor, s.outcome]),
    calls: calls.map((c) => c.name),
    cancelled: (await cairn.wait(cancelled.run_id)).status,
    missing,
    events_url: live.url,
    approvals: inbox.approvals.length,
    undecided,
  }),
);
