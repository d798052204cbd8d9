/**
 * A small typed client for cairn's HTTP API (`cairn serve`), over the platform's fetch:
 * Node 18+, Deno, Bun, a browser, an edge runtime. Every type is generated from the
 * server's OpenAPI document by openapi-typescript (src/schema.ts: `npm run generate`), so
 * the compiler checks each field a caller reads against what the server answers.
 */
import type { components } from "./schema.js";

type Schemas = components["schemas"];
export type Run = Schemas["Run"];
export type RunStatus = Schemas["RunStatus"];
export type Step = Schemas["Step"];
export type Call = Schemas["Call"];
export type Signalled = Schemas["Signalled"];
export type Steered = Schemas["Steered"];
export type NewRun = Schemas["NewRun"];
export type ErrorBody = Schemas["ErrorBody"];
/** One run event: the JSON of each Server-Sent Event of GET /runs/{id}/events. */
export type RunEvent = Schemas["Event"];
export type EventKind = Schemas["EventKind"];
export type EventsToken = Schemas["EventsToken"];
export type Approval = Schemas["Approval"];
export type ApprovalPage = Schemas["ApprovalPage"];
export type NewDecision = Schemas["NewDecision"];

/** The statuses no worker works on: a wait returns at one of them. */
export const STOPPED: ReadonlySet<RunStatus> = new Set<RunStatus>([
  "done",
  "failed",
  "cancelled",
  "budget_exceeded",
  "incompatible",
  "unknown",
]);

/** An error the API answered, in its one shape: the status, a kind to branch on
 * (unknown_run, run_id_conflict, invalid_input, ...) and a sentence for a person. */
export class CairnError extends Error {
  constructor(
    readonly status: number,
    readonly type: string,
    message: string,
  ) {
    super(`${status} ${type}: ${message}`);
    this.name = "CairnError";
  }
}

/** POST /runs's fields but the workflow and its input; idempotencyKey: the run id, sent
 * as the Idempotency-Key header, so a retried request returns the same run. */
export type EnqueueOptions = Omit<NewRun, "workflow" | "input"> & { idempotencyKey?: string };

/** GET /approvals's filters and page. */
export interface ApprovalsOptions {
  workflow?: string;
  name?: string;
  order?: "newest" | "oldest";
  cursor?: number;
  limit?: number;
}

export interface WaitOptions {
  /** Give up (a CairnError of type "timeout") after this long; default 60 s. */
  timeoutMs?: number;
  /** How often to read the run; default 250 ms. */
  everyMs?: number;
  /** Return at the first run this holds for; default: a stopped one. */
  until?: (run: Run) => boolean;
}

export class Cairn {
  readonly baseUrl: string;
  readonly #token: string;

  /** baseUrl: where `cairn serve` listens; token: its CAIRN_API_TOKEN (a server's
   * secret: keep it on your server, hand a browser a run's events token instead). */
  constructor(baseUrl: string, token: string) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.#token = token;
  }

  /** Start a run (202 with it); the same idempotencyKey and input again: the same run. */
  enqueue(
    workflow: string,
    input: Record<string, unknown> = {},
    options: EnqueueOptions = {},
  ): Promise<Run> {
    const { idempotencyKey, ...rest } = options;
    const headers: Record<string, string> =
      idempotencyKey === undefined ? {} : { "Idempotency-Key": idempotencyKey };
    const body: NewRun = { workflow, input, ...rest };
    return this.#call<Run>("POST", "/runs", body, headers);
  }

  /** The run as it stands; a CairnError 404 (unknown_run) if there is none. */
  get(runId: string): Promise<Run> {
    return this.#call<Run>("GET", `/runs/${encodeURIComponent(runId)}`);
  }

  /** Read the run until it stops (or `until` holds for it). */
  async wait(runId: string, options: WaitOptions = {}): Promise<Run> {
    const { timeoutMs = 60_000, everyMs = 250, until = (r: Run) => STOPPED.has(r.status) } =
      options;
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const run = await this.get(runId);
      if (until(run)) return run;
      if (Date.now() >= deadline) {
        throw new CairnError(0, "timeout", `run ${runId} is ${run.status} after ${timeoutMs} ms`);
      }
      await new Promise((done) => setTimeout(done, everyMs));
    }
  }

  /** The run's step attempts that ended, oldest first. */
  async history(runId: string): Promise<Step[]> {
    const path = `/runs/${encodeURIComponent(runId)}/steps`;
    const page = await this.#call<Schemas["Steps"]>("GET", path);
    return page.steps;
  }

  /** The run's journaled calls (model requests, ctx.call), oldest first. */
  async calls(runId: string): Promise<Call[]> {
    const path = `/runs/${encodeURIComponent(runId)}/calls`;
    const page = await this.#call<Schemas["Calls"]>("GET", path);
    return page.calls;
  }

  /** Send the run a signal; the same signalId twice is one signal (stored: false). */
  signal(runId: string, event: string, payload?: unknown, signalId?: string): Promise<Signalled> {
    const body: Schemas["NewSignal"] =
      signalId === undefined ? { payload } : { payload, signal_id: signalId };
    const path = `/runs/${encodeURIComponent(runId)}/signals/${encodeURIComponent(event)}`;
    return this.#call<Signalled>("POST", path, body);
  }

  /** Send a running agent a message, read once and in order at its step's next
   * ctx.messages(); n is its number in the run. A run that has ended: 409 run_ended.
   * interrupt: also cut its interruptible call in flight (its answer discarded). */
  steer(runId: string, message: unknown, interrupt = false): Promise<Steered> {
    const body: Schemas["NewSteer"] = interrupt ? { message, interrupt } : { message };
    return this.#call<Steered>("POST", `/runs/${encodeURIComponent(runId)}/steer`, body);
  }

  /** The approvals inbox: what runs waiting on a person ask, across runs, a page at a
   * time (pass next_cursor as cursor), newest first or oldest. */
  approvals(options: ApprovalsOptions = {}): Promise<ApprovalPage> {
    const query = new URLSearchParams();
    for (const [key, value] of Object.entries(options)) {
      if (value !== undefined) query.set(key, String(value));
    }
    const said = query.toString();
    return this.#call<ApprovalPage>("GET", "/approvals" + (said ? "?" + said : ""));
  }

  /** Decide an approval (approve, deny, or edit with args): its run gets the signal it
   * waits on, with the audit row. Decided already: 409 already_decided. */
  decide(approvalId: number, decision: NewDecision): Promise<Approval> {
    return this.#call<Approval>("POST", `/approvals/${approvalId}/decision`, decision);
  }

  /** Stop a run: a pending one at once, a running one at its next step boundary. */
  cancel(runId: string, reason?: string): Promise<Run> {
    const body: Schemas["Cancel"] = reason === undefined ? {} : { reason };
    return this.#call<Run>("POST", `/runs/${encodeURIComponent(runId)}/cancel`, body);
  }

  /** A token that reads this run's events and nothing else, and the URL a browser's
   * EventSource opens with it (relative to the server). */
  eventsToken(runId: string): Promise<EventsToken> {
    return this.#call<EventsToken>("POST", `/runs/${encodeURIComponent(runId)}/events/token`);
  }

  async #call<T>(
    method: "GET" | "POST",
    path: string,
    body?: unknown,
    headers: Record<string, string> = {},
  ): Promise<T> {
    const init: RequestInit = {
      method,
      headers: {
        Authorization: `Bearer ${this.#token}`,
        ...(body === undefined ? {} : { "Content-Type": "application/json" }),
        ...headers,
      },
    };
    if (body !== undefined) init.body = JSON.stringify(body);
    const response = await fetch(this.baseUrl + path, init);
    const text = await response.text();
    if (!response.ok) {
      let type = "http_error";
      let message = text;
      try {
        const said = JSON.parse(text) as ErrorBody;
        ({ type, message } = said.error);
      } catch {
        // not the API's shape (a proxy's page): the text as it came
      }
      throw new CairnError(response.status, type, message);
    }
    return JSON.parse(text) as T;
  }
}
