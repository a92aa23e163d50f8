/**
 * An approval as a person decides it: what the run asks (name, step, details), a note,
 * Approve / Reject. The decision carries the digest of the request shown here; the
 * server refuses it (409) when the run now asks something else, and the card says so.
 *
 * After a decision for a run whose kernel is gone the run does not continue by itself:
 * the card says "approved; re-run its cell to continue" and offers the notebook at
 * that cell.
 */
import { api, APIError, IAnswer, IDecision, IPending, IRunSummary } from './api';
import {
  answerButtons,
  argumentsForm,
  decisionVerdict,
  elicitation,
  elicitationForm
} from './answers';
import { button, clock, h, pretty, short } from './dom';

/** What the views ask the application to do. */
export interface IActions {
  /** Open the run view of a run in the main area. */
  openRun(run: { journal: string; run_id: string }): void;
  /** Open a notebook (a path under the server root), at the cell with this id if given. */
  openNotebook(path: string, cellId: string | null): Promise<void>;
  /** Fetch the listings again now. */
  refresh(): Promise<void>;
}

/**
 * What the run asks a person now: its pending approval while it waits for one and no
 * decision was given yet (a cancelled or finished run keeps its last request: not asking).
 */
export function asking(run: IRunSummary): IPending | null {
  return run.status === 'WAITING_APPROVAL' && !decided(run) ? run.pending_approval : null;
}

/** The decision the waiting run will take when it resumes (its kernel gone), or null. */
export function toResume(run: IRunSummary): IDecision | null {
  return run.status === 'WAITING_APPROVAL' ? decided(run) : null;
}

/** Whether the run already has a decision for what it shows (taken when its cell runs). */
export function decided(run: IRunSummary): IDecision | null {
  const decision = run.decision;
  const pending = run.pending_approval;
  if (!decision || !pending) {
    return decision ?? null;
  }
  return !decision.digest || decision.digest === pending.digest ? decision : null;
}

/** "approved; re-run its cell to continue", with the notebook at that cell when known. */
export function decisionNote(
  run: IRunSummary,
  decision: IDecision,
  actions: IActions,
  message?: string,
  compact = false
): HTMLElement {
  const said = decisionVerdict(decision);
  const verdict = said.verdict;
  const by = decision.by ? ` by ${decision.by}` : '';
  const note = said.note ? `: “${said.note}”` : '';
  const resumed = message?.includes('resumes in its kernel');
  const text = resumed
    ? message!
    : run.notebook
      ? `${verdict}; re-run its cell to continue`
      : `${verdict}; execute the run again to continue`;
  const who = `${verdict}${by}${note}`;
  const kind = decision.approved ? 'approved' : 'rejected';
  return h(
    'div',
    { class: `dnr-decided dnr-decided-${kind}`, title: who },
    h('div', { class: 'dnr-decided-text' }, text),
    compact ? null : h('div', { class: 'dnr-muted' }, who),
    run.notebook
      ? button(
          'Open its cell',
          'dnr-open-cell',
          () => actions.openNotebook(run.notebook!, run.cell_id),
          `Open ${run.notebook} at the cell that runs ${run.run_id}`
        )
      : resumed || compact
        ? null
        : h('div', { class: 'dnr-muted' }, 'It was started outside a notebook (a script).')
  );
}

/** What is asked: the request's name, step, digest and times. */
function pendingHead(pending: IPending): HTMLElement {
  const asked = pending.requested_at ? ` · asked ${clock(pending.requested_at)}` : '';
  const expires = pending.timeout_at ? ` · times out ${clock(pending.timeout_at)}` : '';
  return h(
    'div',
    { class: 'dnr-pending-head' },
    h('b', {}, pending.name),
    h(
      'span',
      { class: 'dnr-muted' },
      ` step ${pending.key} · details digest ${short(pending.digest)}${asked}${expires}`
    )
  );
}

/** The details of a pending approval, as text; `editing`: without the arguments, which a
 * form under it shows to edit (once, not twice). */
export function pendingDetails(pending: IPending, editing = false): HTMLElement {
  let details = pending.details;
  if (editing && details && typeof details === 'object') {
    details = Object.fromEntries(
      Object.entries(details as Record<string, unknown>).filter(
        ([key, value]) => key !== 'arguments' && !(key === 'tool' && value === pending.name)
      )
    );
  }
  const empty = !!details && typeof details === 'object' && !Object.keys(details).length;
  return h(
    'div',
    { class: 'dnr-pending' },
    pendingHead(pending),
    empty ? null : h('pre', { class: 'dnr-text dnr-details' }, pretty(details))
  );
}

/**
 * Decide `run`'s pending approval as shown. Resolves to the server's message; a 409
 * (the run asks something else now, or nothing) rejects with the server's reason.
 */
export async function decide(
  run: IRunSummary,
  approved: boolean,
  note: string,
  answer: IAnswer = {}
): Promise<string> {
  const pending = run.pending_approval;
  if (!pending) {
    throw new APIError(409, `${run.run_id} waits for no approval`);
  }
  const reply = await api.decide(run, pending, approved, note, answer);
  return reply.message;
}

/**
 * The card of one pending approval: details, a note, Approve and Reject. What a decision
 * did goes to `notice`, which the view keeps across its redraws: the listing is fetched
 * again right after, and a card whose request changed is replaced by the new request.
 */
export function approvalCard(
  run: IRunSummary,
  actions: IActions,
  notice: HTMLElement
): HTMLElement {
  const card = h('div', { class: 'dnr-card', 'data-run': run.run_id });
  const title = h(
    'div',
    { class: 'dnr-card-title' },
    h('a', { class: 'dnr-run-link', href: '#' }, run.run_id),
    run.title ? h('span', { class: 'dnr-muted' }, ` · ${run.title}`) : null,
    run.notebook ? h('span', { class: 'dnr-muted' }, ` · ${run.notebook}`) : null
  );
  title.querySelector('a')!.addEventListener('click', event => {
    event.preventDefault();
    actions.openRun(run);
  });
  card.append(title);
  const pending = run.pending_approval;
  const already = decided(run);
  if (already) {
    card.append(decisionNote(run, already, actions));
    return card;
  }
  if (!pending) {
    return card;
  }
  const question = elicitation(pending);
  if (question) {
    card.append(pendingHead(pending));
    const asked = elicitationForm(question);
    card.append(asked.form);
    card.append(
      answerButtons(action => settle(action === 'accept', '', () => asked.answer(action)))
    );
    return card;
  }
  card.append(pendingDetails(pending, !!pending.editable));
  const answers = pending.editable ? argumentsForm(pending) : null;
  if (answers) {
    card.append(answers.form);
  }
  const note = h('input', {
    class: 'dnr-note',
    type: 'text',
    placeholder: 'note (optional, recorded with the decision)'
  });
  /** Decide with the answer `given` reads (it throws, saying why, when there is none). */
  async function settle(approved: boolean, noted: string, given: () => IAnswer): Promise<void> {
    try {
      const answer = given();
      const message = await decide(run, approved, noted, answer);
      const decision: IDecision = {
        approved,
        by: null,
        at: null,
        note: noted || null,
        digest: pending!.digest,
        answer: answer.answer ?? null,
        args: (answer.args as Record<string, unknown> | undefined) ?? null,
        message: answer.message ?? null
      };
      card.replaceChildren(title, decisionNote(run, decision, actions, message));
      notice.replaceChildren(h('div', { class: 'dnr-ok' }, `${run.run_id}: ${message}`));
    } catch (error) {
      const why = String((error as Error).message);
      notice.replaceChildren(
        h('div', { class: 'dnr-error' }, `${run.run_id}: nothing was decided: ${why}`)
      );
    }
    await actions.refresh();
  }
  const act = (approved: boolean) =>
    settle(approved, note.value, () => (answers ? answers.answer(approved) : {}));
  card.append(
    h(
      'div',
      { class: 'dnr-actions' },
      note,
      button('Approve', 'dnr-approve', () => act(true)),
      button('Reject', 'dnr-reject', () => act(false))
    )
  );
  return card;
}
