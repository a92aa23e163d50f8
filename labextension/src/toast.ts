/**
 * A toast (JupyterLab's Notification) when a run starts waiting for a decision: any run of
 * the journals the server shows, whatever started it (this page's notebooks, another
 * notebook, a terminal, a script). What a person sees:
 *
 * - Each new request once per browser tab session (sessionStorage: a page reload does not
 *   show it again; a request shown anew, with a new id, is new), never again on the next
 *   summaries.
 * - On the first load of a session, the requests already waiting are not toasted one by
 *   one: one toast says how many wait, with "Open inbox" (the tab's badge says it too).
 * - Several requests at once (a batch parking its items) make one toast, not a stack.
 * - A toast stays until its request is decided or gone (from here or anywhere: it is then
 *   dismissed), or the person closes it; JupyterLab's notification list keeps it meanwhile.
 */
import { Notification } from '@jupyterlab/apputils';

import { elicitation } from './answers';
import { asking } from './approval';
import { IPending, IRunSummary } from './api';
import { RunsModel } from './model';

/** Where the requests already toasted in this tab's session are kept. */
const STORAGE_KEY = 'durable-nb:toasted-requests';
/** How many of them are kept (the oldest forgotten first). */
const REMEMBERED = 2000;
/** More new requests than this at once make one toast for them all. */
const ONE_BY_ONE = 3;
/** The most characters of a server's question a toast shows (the form has all of it). */
const QUESTION_SHOWN = 200;

/**
 * What a toast says a run asks: "Run r asks for approval: send_email", or for an MCP
 * server's question "Run r: book on hotels asks: How many nights?" (the server asks, not the
 * run; the message is outside text, which a Notification shows as text).
 */
export function toastText(run: IRunSummary, request: IPending): string {
  const who = run.title ? `${run.run_id} (${run.title})` : run.run_id;
  const question = elicitation(request);
  if (!question) {
    return `Run ${who} asks for approval: ${request.name}`;
  }
  const asker = [question.tool, question.server].filter(Boolean).join(' on ') || 'An MCP server';
  const message = question.message ?? '';
  const shown =
    message.length > QUESTION_SHOWN ? `${message.slice(0, QUESTION_SHOWN - 1)}…` : message;
  return `Run ${who}: ${asker} asks: ${shown}`;
}

/** What a toast's actions do. */
export interface IToastActions {
  openRun(run: { journal: string; run_id: string }): void;
  openInbox(): void;
}

/** The toasts of new pending requests, following `model`. */
export class RequestToasts {
  private _seen: string[];
  private _firstOfSession: boolean;
  private _primed = false;
  /** The toasts shown, by the requests each is about. */
  private _shown = new Map<string, string[]>();

  constructor(
    private readonly _model: RunsModel,
    private readonly _actions: IToastActions
  ) {
    const stored = readStored();
    this._firstOfSession = stored === null;
    this._seen = stored ?? [];
    _model.changed.connect(this._check, this);
  }

  dispose(): void {
    this._model.changed.disconnect(this._check, this);
  }

  private _check(): void {
    const model = this._model;
    // Only a listing the server answered says what is pending (not an error, not a refetch).
    if (model.version === null || model.error !== null) {
      return;
    }
    const pending = new Map<string, IRunSummary>();
    for (const run of model.pending) {
      const request = asking(run);
      if (request) {
        pending.set(requestKey(run, request.id ?? request.digest), run);
      }
    }
    this._dismissGone(pending);
    const seen = new Set(this._seen);
    const fresh = [...pending.entries()].filter(([key]) => !seen.has(key));
    const quiet = !this._primed && this._firstOfSession;
    if (!fresh.length && this._primed) {
      return;
    }
    this._primed = true;
    // Written on the first listing too (maybe with nothing): a reload in this session then
    // toasts one by one whatever arrived meanwhile.
    this._remember(fresh.map(([key]) => key));
    if (!fresh.length) {
      return;
    }
    if (quiet) {
      this._toastWaiting(fresh);
    } else if (fresh.length > ONE_BY_ONE) {
      this._toastMany(fresh);
    } else {
      for (const [key, run] of fresh) {
        this._toastOne(key, run);
      }
    }
  }

  private _toastOne(key: string, run: IRunSummary): void {
    const id = Notification.warning(toastText(run, asking(run)!), {
      autoClose: false,
      actions: [
        {
          label: 'Review',
          caption: `Open the run view of ${run.run_id}, where it can be decided`,
          displayType: 'accent',
          callback: () => this._actions.openRun(run)
        },
        {
          label: 'Inbox',
          caption: 'Open the approvals inbox',
          callback: () => this._actions.openInbox()
        }
      ]
    });
    this._shown.set(id, [key]);
  }

  private _toastMany(fresh: [string, IRunSummary][]): void {
    const batches = new Set(fresh.map(([, run]) => run.batch_id ?? ''));
    const of = batches.size === 1 && !batches.has('') ? ` (batch ${[...batches][0]})` : '';
    this._toastAll(`${fresh.length} new requests for approval${of}`, fresh);
  }

  private _toastWaiting(fresh: [string, IRunSummary][]): void {
    const count = fresh.length;
    this._toastAll(
      `${count} request${count === 1 ? '' : 's'} for approval ${count === 1 ? 'is' : 'are'} waiting`,
      fresh
    );
  }

  private _toastAll(message: string, fresh: [string, IRunSummary][]): void {
    const id = Notification.warning(message, {
      autoClose: false,
      actions: [
        {
          label: 'Open inbox',
          displayType: 'accent',
          callback: () => this._actions.openInbox()
        }
      ]
    });
    this._shown.set(
      id,
      fresh.map(([key]) => key)
    );
  }

  /** Dismiss the toasts none of whose requests is still pending (decided, changed, gone). */
  private _dismissGone(pending: Map<string, IRunSummary>): void {
    for (const [id, keys] of [...this._shown]) {
      if (!Notification.manager.has(id)) {
        this._shown.delete(id); // closed by the person or by an action
      } else if (!keys.some(key => pending.has(key))) {
        Notification.dismiss(id);
        this._shown.delete(id);
      }
    }
  }

  private _remember(keys: string[]): void {
    this._seen = [...this._seen, ...keys].slice(-REMEMBERED);
    try {
      window.sessionStorage.setItem(STORAGE_KEY, JSON.stringify(this._seen));
    } catch {
      // storage full or refused: the toasts are then once per page load
    }
  }
}

/** One request: its journal, its run and its id (new each time a request is shown anew). */
function requestKey(run: IRunSummary, request: string): string {
  return `${run.journal}\n${run.run_id}\n${request}`;
}

/** The requests already toasted in this tab's session, or null in a new session. */
function readStored(): string[] | null {
  try {
    const text = window.sessionStorage.getItem(STORAGE_KEY);
    const value = text === null ? null : JSON.parse(text);
    return Array.isArray(value) ? value.filter(item => typeof item === 'string') : null;
  } catch {
    return null;
  }
}
