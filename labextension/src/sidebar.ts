/**
 * The "Durable runs" left sidebar: the runs of this server's journals (those under its root
 * and the configured ones; every journal of the user when its box is ticked), grouped
 * by status (waiting for approval first, then decided and waiting to resume, running,
 * interrupted, failed, cancelled, done; a batch's items folded under one row), a search
 * box, the notebook each run came from (opened on a click), journals that did not answer,
 * and the count of pending approvals on the sidebar's tab.
 */
import { Widget } from '@lumino/widgets';

import { IActions, asking, decisionNote, toResume } from './approval';
import { IRunSummary } from './api';
import { GROUPS, GroupKey, button, clock, cost, groupOf, h, plural } from './dom';
import { RunsModel } from './model';
import { Origins } from './origin';

/** How many runs of one group are listed before "N more". */
const GROUP_ROWS = 50;

export class RunsSidebar extends Widget {
  private _list: HTMLElement;
  private _status: HTMLElement;
  private _inboxButton: HTMLButtonElement;
  /** The batches folded open (kept across the redraws of a poll). */
  private _openBatches = new Set<string>();
  /** Where the listed runs come from, said as shortly as they stay told apart. */
  private _origins = new Origins([]);

  constructor(
    private readonly _model: RunsModel,
    private readonly _actions: IActions & { openInbox(): void }
  ) {
    super();
    this.id = 'durable-nb-sidebar';
    this.addClass('dnr-sidebar');
    this.title.caption = 'Durable runs';
    const search = h('input', {
      class: 'dnr-search',
      type: 'search',
      placeholder: 'Search runs (id, title, notebook)'
    });
    let typing: number | undefined;
    search.addEventListener('input', () => {
      window.clearTimeout(typing);
      typing = window.setTimeout(() => (this._model.query = search.value.trim()), 250);
    });
    // This server's journals by default; the others (another folder's, another program's)
    // only when asked for.
    const every = h('input', { type: 'checkbox', class: 'dnr-every-box' });
    every.addEventListener('change', () => (this._model.every = every.checked));
    const everyLabel = h(
      'label',
      {
        class: 'dnr-every dnr-muted',
        title:
          "Also the journals outside this server's folder that other notebooks, scripts " +
          'or programs of yours opened'
      },
      every,
      ' Show every journal of this user'
    );
    this._inboxButton = button('Approvals inbox', 'dnr-inbox-button', () => _actions.openInbox());
    this._status = h('div', { class: 'dnr-muted dnr-sidebar-status' });
    this._list = h('div', { class: 'dnr-groups' });
    this.node.append(
      h('div', { class: 'dnr-sidebar-head' }, h('h2', {}, 'Durable runs'), this._inboxButton),
      search,
      everyLabel,
      this._status,
      this._list
    );
    _model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const model = this._model;
    const count = model.pendingCount;
    // The badge on the tab: a data attribute the stylesheet draws (none when zero). The
    // shell keeps its own entries (data-id) in the same dataset.
    const { 'dnr-pending': _, ...others } = this.title.dataset;
    this.title.dataset = count > 0 ? { ...others, 'dnr-pending': String(count) } : others;
    this.title.caption = `Durable runs: ${count} pending approval${count === 1 ? '' : 's'}`;
    this._inboxButton.textContent = `Approvals inbox (${count})`;
    this._inboxButton.classList.toggle('dnr-has-pending', count > 0);
    // How the count stays live ('stream', or 'poll' where the stream could not be opened).
    this.node.dataset.dnrLive = model.transport ?? '';
    const shown = model.runs.length;
    this._status.textContent = model.error
      ? `The server did not answer: ${model.error}`
      : shown < model.total
        ? `${shown} of ${model.total} runs listed; search to narrow`
        : plural(model.total, 'run');
    this._status.classList.toggle('dnr-error', model.error !== null);
    const missing = model.unavailable.map(text => h('div', { class: 'dnr-error' }, text));
    const mismatch = model.mismatch
      ? h('div', { class: 'dnr-error dnr-version-problem' }, model.mismatch)
      : null;
    if (mismatch) {
      this._status.replaceChildren();
    }
    this._origins = new Origins(model.runs);
    this._list.replaceChildren(
      ...(mismatch ? [mismatch] : []),
      ...missing,
      ...this._groups(model.runs)
    );
  }

  private _groups(runs: readonly IRunSummary[]): HTMLElement[] {
    const byGroup = new Map<GroupKey, IRunSummary[]>();
    for (const run of runs) {
      const key = groupOf(run);
      byGroup.set(key, [...(byGroup.get(key) ?? []), run]);
    }
    const sections: HTMLElement[] = [];
    for (const group of GROUPS) {
      const members = byGroup.get(group.key);
      if (!members) {
        continue;
      }
      const rows = this._rows(members.slice(0, GROUP_ROWS));
      const more = members.length - GROUP_ROWS;
      sections.push(
        h(
          'section',
          { class: `dnr-group dnr-group-${group.key}`, 'data-group': group.key },
          h('h3', {}, `${group.label} (${members.length})`),
          ...rows,
          more > 0 ? h('div', { class: 'dnr-muted' }, `${more} more; search to narrow`) : null
        )
      );
    }
    return sections;
  }

  /** The rows of one group, a batch's items folded under one row of their own. */
  private _rows(runs: IRunSummary[]): HTMLElement[] {
    const batches = new Map<string, IRunSummary[]>();
    const rows: HTMLElement[] = [];
    for (const run of runs) {
      if (!run.batch_id) {
        rows.push(this._row(run));
        continue;
      }
      const key = `${run.journal}\n${run.batch_id}`;
      const items = batches.get(key);
      if (items) {
        items.push(run);
      } else {
        batches.set(key, [run]);
        rows.push(h('div', { class: 'dnr-batch-slot', 'data-key': key }));
      }
    }
    // Each batch takes the place of its first item (the server's order is kept).
    return rows.map(row => {
      const items = row.dataset.key ? batches.get(row.dataset.key) : undefined;
      return items ? this._batchRow(items) : row;
    });
  }

  private _batchRow(items: IRunSummary[]): HTMLElement {
    const batchId = items[0].batch_id!;
    const waiting = items.filter(run => asking(run)).length;
    const summary = h(
      'summary',
      { class: 'dnr-run-line' },
      h('span', { class: 'dnr-run-id' }, `${batchId}/`),
      h('span', { class: 'dnr-muted' }, `batch · ${plural(items.length, 'item')}`),
      waiting ? h('span', { class: 'dnr-asks' }, `${waiting} asking`) : null
    );
    const open = this._openBatches.has(batchId);
    const details = h(
      'details',
      { class: 'dnr-batch-row', 'data-batch': batchId },
      summary,
      ...items.map(run => this._row(run))
    );
    details.open = open;
    details.addEventListener('toggle', () => {
      if (details.open) {
        this._openBatches.add(batchId);
      } else {
        this._openBatches.delete(batchId);
      }
    });
    return details;
  }

  private _row(run: IRunSummary): HTMLElement {
    const pending = asking(run);
    const tokens = run.prompt_tokens + run.completion_tokens;
    const facts = [
      plural(run.steps, 'step'),
      tokens ? `${tokens.toLocaleString()} tok` : '',
      cost(run.cost)
    ].filter(Boolean);
    const when = clock(run.updated_at);
    const row = h(
      'div',
      { class: 'dnr-run', 'data-run': run.run_id, title: `Open the run view of ${run.run_id}` },
      // The group says the status; the row says which run, what it asks, how far it got.
      h('div', { class: 'dnr-run-id' }, run.run_id),
      run.title ? h('div', { class: 'dnr-run-title' }, run.title) : null,
      this._origin(run),
      h(
        'div',
        { class: 'dnr-muted' },
        pending ? h('span', { class: 'dnr-asks' }, `asks ${pending.name} · `) : null,
        facts.join(' · '),
        when ? ' · ' : null,
        when ? h('span', { class: 'dnr-when', title: 'last updated' }, when) : null
      ),
      this._deliveryProblem(run)
    );
    const decision = toResume(run);
    if (decision) {
      row.append(decisionNote(run, decision, this._actions, undefined, true));
    }
    row.addEventListener('click', () => this._actions.openRun(run));
    return row;
  }

  /**
   * A waiting run whose notification failed or is being retried: a marker, with which
   * channel and why as its tooltip (the run view lists every attempt). The run stays
   * parked either way.
   */
  private _deliveryProblem(run: IRunSummary): HTMLElement | null {
    const deliveries = run.deliveries;
    if (!deliveries || !(deliveries.failed || deliveries.retrying)) {
      return null;
    }
    const failed = Boolean(deliveries.failed);
    return h(
      'div',
      {
        class: `dnr-delivery-problem ${failed ? 'dnr-delivery-failed' : 'dnr-delivery-retrying'}`,
        title: `${deliveries.problem ?? ''}\nThe run stays parked; open it for every attempt.`
      },
      failed ? '⚠ notification failed' : '⚠ notification retrying'
    );
  }

  /**
   * Which notebook (a link that opens it at the run's cell, when it is under the server's
   * root) and, where the listing spans journals, which journal; the full paths as tooltip.
   */
  private _origin(run: IRunSummary): HTMLElement {
    const origin = this._origins.of(run);
    const line = h('div', { class: 'dnr-origin dnr-muted', title: origin.tooltip });
    if (run.notebook) {
      const link = h('a', { class: 'dnr-notebook', href: '#' }, origin.notebook!);
      link.addEventListener('click', event => {
        event.preventDefault();
        event.stopPropagation();
        void this._actions.openNotebook(run.notebook!, run.cell_id);
      });
      line.append(link);
    } else {
      line.append(origin.notebook ?? 'outside a notebook');
    }
    if (origin.journal) {
      line.append(' · ', h('span', { class: 'dnr-journal' }, `journal ${origin.journal}`));
    }
    return line;
  }
}
