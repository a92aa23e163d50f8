/**
 * The durable_nb server extension's REST API (API.md), typed, over
 * ServerConnection.makeRequest: the token, the cookies and the XSRF header are
 * the ones JupyterLab's own requests carry.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** A pending approval, as the run shows it to a person. */
export interface IPending {
  run_id: string;
  key: string;
  name: string;
  details: unknown;
  digest: string;
  /** The request's id: a request asked again (even identical) has a new one. */
  id: string | null;
  requested_at: number | null;
  timeout_at: number | null;
  /** A tool call's request: its `details.arguments` may be edited (decided with `args`). */
  editable?: boolean;
}

/**
 * A decision beyond yes or no: edited arguments (approve) or a message for the model
 * (reject); for an MCP server's question, the answer (content with accept only).
 */
export interface IAnswer {
  args?: unknown;
  message?: string;
  answer?: IQuestionAnswer;
}

/** An answer to an MCP server's question: its action, and the form's content on accept. */
export interface IQuestionAnswer {
  action: 'accept' | 'decline' | 'cancel';
  content?: Record<string, unknown> | null;
}

/** A decision already given but not yet taken by the run (its kernel is gone). */
export interface IDecision {
  approved: boolean;
  by: string | null;
  at: number | null;
  note: string | null;
  digest: string | null;
  /** The answer to an MCP server's question; null (or absent, an older server) otherwise. */
  answer?: IQuestionAnswer | null;
  /** The edited arguments an approval runs the tool with; null or absent otherwise. */
  args?: Record<string, unknown> | null;
  /** A rejection's message to the model; null or absent otherwise. */
  message?: string | null;
}

/**
 * A waiting run's notifications of its request (issue 27): how many of its channels were
 * sent, failed (attempts used up), are retrying, sending or skipped, and, when one failed or
 * is retrying, `problem`: which channel and why. Counts only; the run view has every delivery.
 */
export interface IDeliveries {
  sent?: number;
  failed?: number;
  retrying?: number;
  sending?: number;
  skipped?: number;
  problem?: string;
}

/** One notification delivery of a run (durable_nb.notify.audit.notifications). */
export interface IDelivery {
  channel: string;
  state: string;
  /** Where it stands: sent, failed, skipped, retrying or sending. */
  outcome: string;
  request: string;
  name?: string | null;
  digest?: string;
  claimed_at?: number;
  finished_at?: number;
  at?: number;
  takeovers?: number;
  attempts?: { at: number; took: number; ok: boolean; error?: string }[];
}

/** One event of a run's history (durable_nb.execution.history): `text` says it all. */
export interface IHistoryEvent {
  kind: string;
  at: number;
  text: string;
  by?: string;
  via?: string;
  name?: string;
  request?: string;
}

/** One run in a listing. */
export interface IRunSummary {
  /** The journal's id, and its location as shown (a PostgreSQL URL without its password). */
  journal: string;
  journal_location: string;
  /**
   * Where the journal is, as people tell it apart: relative to the server's root when under
   * it, else its absolute path or PostgreSQL URL without password (API 3).
   */
  journal_name?: string;
  run_id: string;
  title: string | null;
  status: string;
  interrupted: boolean;
  created_at: number | null;
  updated_at: number | null;
  finished_at: number | null;
  iteration: number;
  prompt_tokens: number;
  completion_tokens: number;
  cost: number | null;
  steps: number;
  /** The notebook under the server's root (what Lab opens), and as its kernel recorded it. */
  notebook: string | null;
  notebook_path: string | null;
  cell_id: string | null;
  pending_approval: IPending | null;
  /** Only for a run waiting for a decision; null when nothing was notified. */
  deliveries?: IDeliveries | null;
  decision: IDecision | null;
  batch_id: string | null;
  parent: string | null;
  error: string | null;
}

/** One run with what only the run view shows. */
export interface IRunRecord extends IRunSummary {
  result?: unknown;
  forked_from?: string | null;
  attempts?: unknown[];
  deadline?: number | null;
  max_iterations?: number | null;
  max_tokens?: number | null;
  max_cost?: number | null;
  notifications?: IDelivery[];
  history?: IHistoryEvent[];
}

/** One journal step, as text built by the server from journal data only. */
export interface IStep {
  position: number;
  key: string;
  kind: string;
  name: string;
  ok: boolean;
  started_at: number | null;
  finished_at: number | null;
  prompt_tokens: number;
  completion_tokens: number;
  cost: number | null;
  asked: string | null;
  answer: string | null;
}

export interface IRunList {
  runs: IRunSummary[];
  total: number;
  page: number;
  limit: number;
  pending_approvals: number;
  /** Journals that did not answer (left out of the listing), with why. */
  unavailable?: { journal: string; error: string }[];
}

export interface IRunDetail {
  record: IRunRecord;
  steps: IStep[];
}

export interface ISummary {
  pending_approvals: number;
  version: string;
}

export interface IDecisionReply {
  ok: boolean;
  status: string;
  message: string;
  /** Whether a kernel watching the parked run took the decision at once. */
  taken: boolean;
  /** Who decided: the Jupyter user. */
  by: string;
}

/** An error the server answered with: its status and its message. */
export class APIError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

/**
 * This extension's version: the durable-nb package it is built with (pyproject.toml and
 * package.json say the same; tests/test_labextension.py checks). The server extension's must
 * match: the REST API is their contract.
 */
export const FRONTEND_VERSION = '0.1.0';

const settings = ServerConnection.makeSettings();

/** Call `endpoint` under `{base_url}durable-nb/api/`; the decoded JSON or an APIError. */
async function request<T>(endpoint: string, init: RequestInit = {}): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'durable-nb/api', endpoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new APIError(0, `the Jupyter server did not answer: ${error}`);
  }
  const text = await response.text();
  let data: any = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { message: text };
  }
  if (!response.ok) {
    const why = data?.message ?? response.statusText;
    throw new APIError(response.status, `${why} (HTTP ${response.status})`);
  }
  return data as T;
}

function query(params: Record<string, string | number | undefined>): string {
  const kept: Record<string, string> = {};
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== '') {
      kept[name] = String(value);
    }
  }
  return URLExt.objectToQueryString(kept);
}

function post<T>(endpoint: string, body: unknown): Promise<T> {
  return request<T>(endpoint, { method: 'POST', body: JSON.stringify(body) });
}

/**
 * The URL of the summary's event stream (`GET events`, server-sent events) for an
 * EventSource, which sends the page's cookies but no header: the token goes in the query
 * where JupyterLab's own websockets put it (a server on another host than the page's).
 */
export function eventsUrl(every = false): string {
  const url = URLExt.join(settings.baseUrl, 'durable-nb/api/events');
  return (
    url +
    query({
      all: every ? 'true' : undefined,
      token: settings.token && settings.appendToken ? settings.token : undefined
    })
  );
}

export const api = {
  /** The durable_nb version of the server extension (404: the extension is not loaded). */
  version: (): Promise<{ version: string }> => request('version'),

  /** `every`: every journal of this user, not only this server's (`all=true`). */
  summary: (every = false): Promise<ISummary> =>
    request('summary' + query({ all: every ? 'true' : undefined })),

  runs: ({
    all,
    ...params
  }: {
    q?: string;
    status?: string;
    page?: number;
    limit?: number;
    all?: boolean;
  }): Promise<IRunList> =>
    request('runs' + query({ ...params, all: all ? 'true' : undefined })),

  run: (journal: string, id: string): Promise<IRunDetail> =>
    request('run' + query({ journal, id })),

  /**
   * Decide the pending approval shown: bound to its request id and its digest both (409 when
   * the run asks another request now, even an identical one asked again after this one).
   */
  decide: (
    run: { journal: string; run_id: string },
    pending: IPending,
    approved: boolean,
    note: string,
    answer: IAnswer = {}
  ): Promise<IDecisionReply> =>
    post('run/decision', {
      journal: run.journal,
      id: run.run_id,
      approved,
      note: note || null,
      request_id: pending.id,
      digest: pending.digest,
      ...answer
    }),

  cancel: (journal: string, id: string): Promise<{ message?: string }> =>
    post('run/cancel', { journal, id })
};
