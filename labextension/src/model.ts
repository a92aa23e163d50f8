/**
 * What the sidebar, the inbox and the run views show, kept fresh by the server.
 *
 * The summary (a count and a version) is pushed: an EventSource on `GET events`, whose
 * server sends it when it changes (one watcher per server, whatever the number of open
 * tabs), so an idle Lab asks nothing. The listings are fetched again only when the version
 * changed or the search changed. Where the stream cannot be opened (a server extension
 * without it, a proxy that refuses it) the model falls back to asking `GET summary` every
 * POLL_MS while the page is visible.
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { api, APIError, eventsUrl, FRONTEND_VERSION, IRunSummary, ISummary } from './api';

/** How often the fallback poll asks the summary (the issue allows a second or two). */
export const POLL_MS = 1500;

/** How the summary arrives: pushed by the server, or asked by the fallback poll. */
export type Transport = 'stream' | 'poll' | null;
/** How many runs the sidebar lists (the server sorts: pending approvals first). */
export const LIST_LIMIT = 200;
/** How many pending approvals the inbox lists. */
export const INBOX_LIMIT = 500;

export class RunsModel {
  private _runs: IRunSummary[] = [];
  private _pending: IRunSummary[] = [];
  private _total = 0;
  private _unavailable: string[] = [];
  private _pendingCount = 0;
  private _version: string | null = null;
  private _query = '';
  private _every = false;
  private _error: string | null = null;
  private _mismatch: string | null = null;
  private _changed = new Signal<this, void>(this);
  private _poll: Poll;
  private _source: EventSource | null = null;
  private _transport: Transport = null;
  private _applying: Promise<void> = Promise.resolve();
  private _disposed = false;

  constructor() {
    this._poll = new Poll({
      auto: false,
      factory: () => this._tick(),
      frequency: { interval: POLL_MS, backoff: true, max: 30 * 1000 },
      name: 'durable-nb:summary',
      standby: 'when-hidden'
    });
    this._openStream();
    void this._checkVersion();
  }

  /** How the summary arrives now: 'stream', 'poll' (the fallback), null before either. */
  get transport(): Transport {
    return this._transport;
  }

  /**
   * Why this extension cannot work with the server's, or null: the server extension is
   * missing (not installed or not enabled in the server's environment) or of another
   * version than this frontend.
   */
  get mismatch(): string | null {
    return this._mismatch;
  }

  /** Emitted after anything shown changed (the listings, the count, an error). */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The listed runs, in the server's order (waiting for approval first). */
  get runs(): readonly IRunSummary[] {
    return this._runs;
  }

  /** The runs waiting for approval (the inbox). */
  get pending(): readonly IRunSummary[] {
    return this._pending;
  }

  /** How many runs match the search (the listing may show fewer). */
  get total(): number {
    return this._total;
  }

  get pendingCount(): number {
    return this._pendingCount;
  }

  /** The journals left out of the listing because they did not answer, each with why. */
  get unavailable(): readonly string[] {
    return this._unavailable;
  }

  /** The last error talking to the server, or null once it answers again. */
  get error(): string | null {
    return this._error;
  }

  /** The journal version the listings were fetched at (changes when anything listed does). */
  get version(): string | null {
    return this._version;
  }

  get query(): string {
    return this._query;
  }

  /** Search runs by id, title or notebook (the server matches; the listing is refetched). */
  set query(text: string) {
    if (text === this._query) {
      return;
    }
    this._query = text;
    void this.refresh();
  }

  /** Whether every journal of this user is listed, not only this server's. */
  get every(): boolean {
    return this._every;
  }

  /** List every journal of this user (true) or this server's (false): listed again. */
  set every(every: boolean) {
    if (every === this._every) {
      return;
    }
    this._every = every;
    if (this._source !== null) {
      this._source.close(); // the stream counts the journals listed: opened again for them
      this._openStream();
    }
    void this.refresh();
  }

  /** Fetch the summary and the listings now (after a decision, say). */
  async refresh(): Promise<void> {
    this._version = null;
    if (this._transport === 'poll') {
      await this._poll.refresh();
      return;
    }
    try {
      await this._apply(await api.summary(this._every));
    } catch {
      // said in `error`; the stream's next summary fetches again
    }
  }

  dispose(): void {
    this._disposed = true;
    this._source?.close();
    this._poll.dispose();
    Signal.clearData(this);
  }

  /**
   * Listen to the server's summary events. The browser reconnects a stream that broke by
   * itself (after the delay the server asks); a stream refused or never opened (an answer
   * that is not an event stream: 404, 403, a proxy) gives way to the poll.
   */
  private _openStream(): void {
    if (typeof EventSource === 'undefined') {
      this._usePoll();
      return;
    }
    const source = new EventSource(eventsUrl(this._every));
    this._source = source;
    source.addEventListener('summary', event =>
      this._pushed(JSON.parse((event as MessageEvent).data) as ISummary)
    );
    source.onopen = () => {
      if (this._transport !== 'stream') {
        this._transport = 'stream';
        this._changed.emit();
      }
    };
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED) {
        source.close();
        this._source = null;
        this._usePoll();
      } else if (this._transport === 'stream') {
        // The browser reconnects; the server's first event then fetches the listings again.
        this._error = 'the Jupyter server did not answer: reconnecting';
        this._changed.emit();
      }
    };
  }

  /** A summary the stream brought, shown in order; a fetch that failed is tried again. */
  private _pushed(summary: ISummary): void {
    this._applying = this._applying
      .then(() => this._apply(summary))
      .catch(() => {
        setTimeout(() => {
          if (!this._disposed && this._error !== null && this._source !== null) {
            void api.summary(this._every).then(
              latest => this._pushed(latest),
              () => this._pushed(summary)
            );
          }
        }, POLL_MS);
      });
  }

  /** The fallback: ask `GET summary` every POLL_MS. */
  private _usePoll(): void {
    if (this._disposed || this._transport === 'poll') {
      return;
    }
    this._transport = 'poll';
    this._changed.emit();
    if (this._mismatch === null) {
      void this._poll.start();
    }
  }

  /** Compare the server extension's version with this frontend's, once. */
  private async _checkVersion(): Promise<void> {
    try {
      const server = (await api.version()).version;
      if (server === FRONTEND_VERSION || server === 'unknown') {
        return; // 'unknown': a source checkout without package metadata
      }
      this._mismatch =
        `The Jupyter server runs durable_nb ${server}, this JupyterLab extension is ` +
        `${FRONTEND_VERSION}: install one version in the server's environment ` +
        `(pip install durable-nb==${server} there, or this version everywhere), restart ` +
        'the server and reload this page.';
    } catch (error) {
      if (!(error instanceof APIError && error.status === 404)) {
        return; // the server did not answer: the poll says so
      }
      this._mismatch =
        "The Jupyter server has no durable_nb extension, so nothing can be listed: install " +
        "durable-nb in the server's environment (or enable it: jupyter server extension " +
        'enable durable_nb.server), restart the server and reload this page.';
      this._source?.close(); // nothing to ask until then
      this._source = null;
      void this._poll.stop();
    }
    this._changed.emit();
  }

  private async _tick(): Promise<void> {
    await this._apply(await api.summary(this._every).catch(error => {
      this._error = String((error as Error).message ?? error);
      this._changed.emit();
      throw error; // the poll backs off while the server does not answer
    }));
  }

  /** Show `summary`: the listings fetched again if its version is not the one shown. */
  private async _apply(summary: ISummary): Promise<void> {
    try {
      if (summary.version !== this._version || this._error !== null) {
        await this._fetch(summary.pending_approvals);
        this._version = summary.version;
      } else if (summary.pending_approvals !== this._pendingCount) {
        this._pendingCount = summary.pending_approvals;
      } else {
        return;
      }
      this._error = null;
    } catch (error) {
      this._error = String((error as Error).message ?? error);
      this._changed.emit();
      throw error;
    }
    this._changed.emit();
  }

  private async _fetch(pendingCount: number): Promise<void> {
    const [listing, inbox] = await Promise.all([
      api.runs({ q: this._query, limit: LIST_LIMIT, all: this._every }),
      pendingCount > 0
        ? api.runs({ status: 'waiting_approval', limit: INBOX_LIMIT, all: this._every })
        : Promise.resolve(null)
    ]);
    this._runs = listing.runs;
    this._total = listing.total;
    this._unavailable = (listing.unavailable ?? []).map(
      ({ journal, error }) => `journal ${journal}: ${error}`
    );
    this._pending = inbox?.runs ?? [];
    this._pendingCount = inbox?.pending_approvals ?? listing.pending_approvals;
  }
}
