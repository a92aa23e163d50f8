/**
 * The approvals inbox (main area): every pending approval of every known journal, each
 * with its details as the person decides them, Approve / Reject with a note. Approvals
 * of one batch are listed together with "Approve all shown": it decides exactly the
 * cards on screen (after the filter), each with the digest of the request its card
 * shows, so a request that changed meanwhile is refused and reported, not approved. An MCP
 * server's question is left out of it (a plain approve is no answer to a form): it waits for
 * its form's Accept, Decline or Cancel, and the batch says how many do.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { elicitation } from './answers';
import { IActions, approvalCard, asking, decide } from './approval';
import { IRunSummary } from './api';
import { button, h, plural } from './dom';
import { RunsModel } from './model';

export class ApprovalsInbox extends Widget {
  private _body: HTMLElement;
  private _notice: HTMLElement;
  private _filter: HTMLInputElement;
  private _shownKey = '';

  constructor(
    private readonly _model: RunsModel,
    private readonly _actions: IActions
  ) {
    super();
    this.id = 'durable-nb-inbox';
    this.addClass('dnr-inbox');
    this.title.label = 'Approvals';
    this.title.caption = 'Approvals inbox';
    this.title.closable = true;
    this._filter = h('input', {
      class: 'dnr-search',
      type: 'search',
      placeholder: 'Filter approvals (run, tool, details)'
    });
    this._filter.addEventListener('input', () => this._render(true));
    this._body = h('div', { class: 'dnr-inbox-body' });
    // Outlives the redraws: what the last "approve all shown" did.
    this._notice = h('div', { class: 'dnr-notice' });
    this.node.append(
      h('div', { class: 'dnr-inbox-head' }, h('h2', {}, 'Approvals inbox'), this._filter),
      this._notice,
      this._body
    );
    _model.changed.connect(() => this._render(false), this);
    this._render(true);
  }

  dispose(): void {
    Signal.disconnectReceiver(this);
    super.dispose();
  }

  /** The approvals the filter keeps, undecided ones only. */
  private _shown(): IRunSummary[] {
    const words = this._filter.value.toLowerCase().split(/\s+/).filter(Boolean);
    return this._model.pending.filter(run => {
      const pending = asking(run);
      if (!pending) {
        return false;
      }
      const text = [
        run.run_id,
        run.title,
        run.notebook,
        pending.name,
        JSON.stringify(pending.details)
      ]
        .join(' ')
        .toLowerCase();
      return words.every(word => text.includes(word));
    });
  }

  /** Redraw when what is listed changed (not on every poll: a half-typed note stays). */
  private _render(force: boolean): void {
    const shown = this._shown();
    const key = shown
      .map(run => `${run.journal}\n${run.run_id}\n${run.pending_approval!.digest}`)
      .join('\n');
    if (!force && key === this._shownKey) {
      return;
    }
    this._shownKey = key;
    // Short, for the tab keeps its whole label (style/index.css); the long form as tooltip.
    const count = this._model.pendingCount;
    this.title.label = `Approvals (${count})`;
    this.title.caption = `Approvals inbox: ${plural(count, 'pending approval')}`;
    if (this._model.error) {
      this._body.replaceChildren(h('div', { class: 'dnr-error' }, this._model.error));
      return;
    }
    if (!shown.length) {
      const none = this._model.pending.length
        ? 'No approval matches the filter.'
        : 'No approval is pending.';
      this._body.replaceChildren(h('div', { class: 'dnr-empty' }, none));
      return;
    }
    const batches = new Map<string, IRunSummary[]>();
    const single: IRunSummary[] = [];
    for (const run of shown) {
      if (run.batch_id) {
        const id = `${run.journal}\n${run.batch_id}`;
        batches.set(id, [...(batches.get(id) ?? []), run]);
      } else {
        single.push(run);
      }
    }
    const sections = [...batches.values()].map(runs => this._batch(runs));
    const cards = single.map(run => approvalCard(run, this._actions, this._notice));
    this._body.replaceChildren(...sections, ...cards);
  }

  private _batch(runs: IRunSummary[]): HTMLElement {
    const batchId = runs[0].batch_id!;
    const note = h('input', {
      class: 'dnr-note',
      type: 'text',
      placeholder: 'note for every approval (optional)'
    });
    const approvable = runs.filter(run => !elicitation(run.pending_approval));
    const questions = runs.length - approvable.length;
    const their = questions === 1 ? 'its' : 'their';
    const left = questions
      ? `${plural(questions, 'question')} of an MCP server left for ${their} form`
      : '';
    // A question is no pending approval: it is counted as what it is.
    const waiting = [
      approvable.length ? plural(approvable.length, 'pending approval') : '',
      questions ? plural(questions, 'question') : ''
    ]
      .filter(Boolean)
      .join(' and ');
    const label = `Approve all shown (${approvable.length})`;
    const approveAll = button(label, 'dnr-approve dnr-approve-all', async () => {
      const names = approvable.map(run => `${run.run_id}: ${run.pending_approval!.name}`);
      const answer = await showDialog({
        title: `Approve ${approvable.length} requests of batch ${batchId}?`,
        body: new Widget({
          node: h(
            'div',
            {},
            h('pre', { class: 'dnr-text dnr-dialog-list' }, names.join('\n')),
            left ? h('div', { class: 'dnr-muted' }, `Not approved: ${left}.`) : null
          )
        }),
        buttons: [
          Dialog.cancelButton(),
          Dialog.okButton({ label: `Approve ${approvable.length}` })
        ]
      });
      if (!answer.button.accept) {
        return;
      }
      const done = await this._approveAll(batchId, approvable, note.value, left);
      this._notice.replaceChildren(done);
      await this._actions.refresh();
    });
    approveAll.disabled = !approvable.length;
    return h(
      'section',
      { class: 'dnr-batch', 'data-batch': batchId },
      h(
        'div',
        { class: 'dnr-batch-head' },
        h('h3', {}, `Batch ${batchId}: ${waiting} shown`),
        note,
        approveAll,
        left
          ? h('div', { class: 'dnr-muted dnr-batch-left' }, `Not in Approve all: ${left}`)
          : null
      ),
      ...runs.map(run => approvalCard(run, this._actions, this._notice))
    );
  }

  /** Approve each run as its card shows it; says how many were approved, which were not,
   * and what was `left` out (questions, for their forms). */
  private async _approveAll(
    batchId: string,
    runs: IRunSummary[],
    note: string,
    left: string
  ): Promise<HTMLElement> {
    const refused: string[] = [];
    for (const run of runs) {
      try {
        await decide(run, true, note);
      } catch (error) {
        refused.push(`${run.run_id}: ${(error as Error).message}`);
      }
    }
    const approved = runs.length - refused.length;
    return h(
      'div',
      { class: refused.length ? 'dnr-error' : 'dnr-ok' },
      `Batch ${batchId}: ${approved} approved${left ? `; ${left}` : ''}` +
        (refused.length ? `; ${refused.length} not:` : ''),
      refused.length ? h('pre', { class: 'dnr-text' }, refused.join('\n')) : null
    );
  }
}

