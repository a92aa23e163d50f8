/**
 * The run view (main area): the header, timeline, step details, attempts, history (what
 * people and policies did about its approvals), notifications and result of one run, read from the REST API, so it works with the run's kernel dead, its notebook
 * closed, or the run started from a script or a Dask worker. It is fetched again when
 * the journal version the sidebar polls changes.
 */
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { IActions, approvalCard, asking, decisionNote, toResume } from './approval';
import { api, IDelivery, IHistoryEvent, IRunDetail, IRunRecord, IStep } from './api';
import { button, clock, cost, duration, h, plural, pretty, short, statusBadge } from './dom';
import { RunsModel } from './model';

/** The newest steps listed in the timeline (a long run lists its tail). */
const TIMELINE_ROWS = 300;

export class RunView extends Widget {
  private _fetchedAt: string | null = null;
  private _loading = false;
  /** What the last decision or cancel did (kept across redraws). */
  private _notice = h('div', { class: 'dnr-notice' });

  constructor(
    readonly journal: string,
    readonly runId: string,
    private readonly _model: RunsModel,
    private readonly _actions: IActions
  ) {
    super();
    this.addClass('dnr-runview');
    this.title.label = runId;
    this.title.caption = `Durable run ${runId}`;
    this.title.closable = true;
    this.node.append(h('div', { class: 'dnr-muted' }, `Loading ${runId}…`));
    _model.changed.connect(this._onChanged, this);
    void this.load();
  }

  dispose(): void {
    Signal.disconnectReceiver(this);
    super.dispose();
  }

  /** Fetch the run and draw it (or say why it could not be read). */
  async load(): Promise<void> {
    if (this._loading) {
      return;
    }
    this._loading = true;
    this._fetchedAt = this._model.version;
    try {
      this._draw(await api.run(this.journal, this.runId));
    } catch (error) {
      this.node.replaceChildren(
        h('div', { class: 'dnr-error' }, `${this.runId}: ${(error as Error).message}`)
      );
    } finally {
      this._loading = false;
    }
  }

  private _onChanged(): void {
    if (this._model.version !== this._fetchedAt) {
      void this.load();
    }
  }

  private _draw(detail: IRunDetail): void {
    const record = detail.record;
    this.title.label = record.title ? `${record.title} (${record.run_id})` : record.run_id;
    const pending = asking(record);
    const decision = toResume(record);
    const parts = [
      this._header(record),
      this._stats(record),
      record.error ? h('pre', { class: 'dnr-text dnr-error' }, record.error) : null,
      this._notice,
      pending ? approvalCard(record, this._actions, this._notice) : null,
      decision ? decisionNote(record, decision, this._actions) : null,
      this._timeline(detail.steps),
      this._attempts(record.attempts),
      this._history(record.history),
      this._notifications(record.notifications),
      // A run that returned nothing (None) shows no result.
      record.result !== null && record.result !== undefined && record.result !== 'null'
        ? h(
            'section',
            { class: 'dnr-result' },
            h('h3', {}, 'Result'),
            h('pre', { class: 'dnr-text' }, pretty(record.result))
          )
        : null
    ];
    this.node.replaceChildren(...parts.filter((part): part is HTMLElement => part !== null));
  }

  private _header(record: IRunRecord): HTMLElement {
    const links: (HTMLElement | string)[] = [];
    if (record.notebook) {
      links.push(
        button('Open notebook', 'dnr-open-notebook', () =>
          this._actions.openNotebook(record.notebook!, record.cell_id)
        )
      );
    }
    const terminal = ['DONE', 'FAILED', 'CANCELLED'].includes(record.status);
    if (!terminal) {
      links.push(
        button('Cancel run', 'dnr-cancel', async () => {
          try {
            const reply = await api.cancel(record.journal, record.run_id);
            this._notice.replaceChildren(
              h('div', { class: 'dnr-ok' }, `${record.run_id}: ${reply.message ?? 'cancelled'}`)
            );
          } catch (error) {
            const why = String((error as Error).message);
            this._notice.replaceChildren(h('div', { class: 'dnr-error' }, why));
          }
          await this._actions.refresh();
        })
      );
    }
    const origin = [
      record.notebook ? `notebook ${record.notebook}` : 'started outside a notebook',
      record.batch_id ? `batch ${record.batch_id}` : '',
      record.parent ? `child of ${record.parent}` : '',
      record.forked_from ? `forked from ${record.forked_from}` : '',
      `journal ${record.journal_location || record.journal}`
    ].filter(Boolean);
    return h(
      'header',
      { class: 'dnr-run-header' },
      h(
        'div',
        { class: 'dnr-run-line' },
        h('b', { class: 'dnr-run-id' }, record.run_id),
        record.title ? h('span', {}, ` · ${record.title}`) : null,
        statusBadge(record),
        ...links
      ),
      h('div', { class: 'dnr-muted' }, origin.join(' · '))
    );
  }

  private _stats(record: IRunRecord): HTMLElement {
    const of = (limit: number | null | undefined, format = (n: number) => n.toLocaleString()) =>
      limit ? ` of ${format(limit)}` : '';
    const parts = [
      `iteration ${record.iteration}${of(record.max_iterations)}`,
      `tokens ${record.prompt_tokens.toLocaleString()} prompt / ` +
        `${record.completion_tokens.toLocaleString()} completion${of(record.max_tokens)}`,
      record.cost || record.max_cost
        ? `cost ${cost(record.cost) || '$0'}${of(record.max_cost, cost)}`
        : '',
      plural(record.steps, 'step'),
      `started ${clock(record.created_at)}`,
      record.finished_at
        ? `finished ${clock(record.finished_at)}`
        : `updated ${clock(record.updated_at)}`,
      record.deadline ? `deadline ${clock(record.deadline)}` : ''
    ].filter(Boolean);
    return h('div', { class: 'dnr-stats' }, parts.join(' · '));
  }

  private _timeline(steps: IStep[]): HTMLElement {
    const shown = steps.slice(-TIMELINE_ROWS);
    const hidden = steps.length - shown.length;
    const head = h(
      'div',
      { class: 'dnr-step-head' },
      ...['#', 'kind', 'name', 'time', 'outcome', 'tokens / cost'].map(text => h('span', {}, text))
    );
    return h(
      'section',
      { class: 'dnr-timeline' },
      h('h3', {}, `Timeline (${plural(steps.length, 'step')}; click a step for its details)`),
      hidden > 0 ? h('div', { class: 'dnr-muted' }, `${hidden} earlier steps not shown`) : null,
      head,
      ...shown.map(step => this._step(step))
    );
  }

  private _step(step: IStep): HTMLElement {
    const seconds =
      typeof step.started_at === 'number' && typeof step.finished_at === 'number'
        ? step.finished_at - step.started_at
        : null;
    const time = step.kind === 'approval' || seconds === null ? '–' : duration(seconds);
    const tokens = step.prompt_tokens || step.completion_tokens
      ? `${step.prompt_tokens.toLocaleString()}+${step.completion_tokens.toLocaleString()} tok`
      : '';
    const spend = [tokens, cost(step.cost)].filter(Boolean).join(' · ');
    return h(
      'details',
      { class: `dnr-step ${step.ok ? '' : 'dnr-step-failed'}` },
      h(
        'summary',
        {},
        h('span', {}, String(step.position)),
        h('span', {}, step.kind),
        h('span', { class: 'dnr-name', title: step.name }, step.name),
        h('span', {}, time),
        h('span', {}, step.ok ? 'ok' : 'failed'),
        h('span', {}, spend)
      ),
      h(
        'div',
        { class: 'dnr-step-body' },
        h('div', { class: 'dnr-muted' }, `key ${step.key}`),
        ...(step.asked && step.asked !== 'null'
          ? [h('h4', {}, 'Asked'), h('pre', { class: 'dnr-text' }, step.asked)]
          : []),
        h('h4', {}, step.ok ? 'Answer' : 'Error'),
        h('pre', { class: 'dnr-text' }, step.answer ?? '')
      )
    );
  }

  private _attempts(attempts: unknown[] | undefined): HTMLElement | null {
    if (!attempts || !attempts.length) {
      return null;
    }
    return h(
      'section',
      { class: 'dnr-attempts' },
      h('h3', {}, `Attempts (${attempts.length})`),
      ...attempts.map((attempt, index) =>
        h('pre', { class: 'dnr-text' }, `${index + 1}. ${pretty(attempt)}`)
      )
    );
  }

  /** The run's history, oldest first: when, what kind, and its sentence (written with it). */
  private _history(events: IHistoryEvent[] | undefined): HTMLElement | null {
    if (!events || !events.length) {
      return null;
    }
    return h(
      'section',
      { class: 'dnr-history' },
      h('h3', {}, `History (${plural(events.length, 'event')})`),
      ...events.map(event =>
        h(
          'div',
          { class: `dnr-event dnr-event-${event.kind}`, 'data-kind': event.kind },
          h('span', { class: 'dnr-when' }, clock(event.at)),
          h('span', { class: 'dnr-event-kind' }, event.kind),
          h('span', { class: 'dnr-event-text' }, event.text)
        )
      )
    );
  }

  /** Each notification delivery: channel, where it stands, request, and every attempt. */
  private _notifications(deliveries: IDelivery[] | undefined): HTMLElement | null {
    if (!deliveries || !deliveries.length) {
      return null;
    }
    const count = deliveries.length;
    return h(
      'section',
      { class: 'dnr-notifications' },
      h('h3', {}, `Notifications (${count} ${count === 1 ? 'delivery' : 'deliveries'})`),
      ...deliveries.map(delivery => this._delivery(delivery))
    );
  }

  private _delivery(delivery: IDelivery): HTMLElement {
    const attempts = delivery.attempts ?? [];
    const state = delivery.outcome ?? delivery.state;
    const facts = [
      `${delivery.name ?? 'a request'} (details digest ${short(delivery.digest)})`,
      attempts.length ? plural(attempts.length, 'attempt') : '',
      delivery.takeovers ? `taken over ${delivery.takeovers}× from a sender that stopped` : ''
    ].filter(Boolean);
    return h(
      'div',
      { class: `dnr-delivery dnr-delivery-${state}`, 'data-channel': delivery.channel },
      h(
        'div',
        {},
        h('b', {}, delivery.channel),
        ' ',
        h('span', { class: 'dnr-delivery-state' }, state),
        h('span', { class: 'dnr-muted' }, ` · ${facts.join(' · ')}`)
      ),
      ...attempts.map(attempt =>
        h(
          'div',
          { class: 'dnr-muted dnr-delivery-attempt' },
          `${clock(attempt.at)} ${attempt.ok ? 'ok' : `failed: ${attempt.error ?? '?'}`} ` +
            `(${duration(attempt.took)})`
        )
      )
    );
  }
}
