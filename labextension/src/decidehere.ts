/**
 * Approve / Reject in a notebook whose kernel stopped, through the server.
 *
 * The saved view of a kernel panel (durable_nb/notebook/panel.py, `static_html`) marks a
 * pending approval with an empty `.dnb-decide-here` element naming the run
 * (`data-durable-nb-decide`), the digest of the request it shows (`data-durable-nb-digest`)
 * and that request's id (`data-durable-nb-request`). Each such element gets a note, Approve
 * and Reject that decide through the server extension, bound to that id and digest (a tool
 * call's arguments editable in place and a message for the model on Reject, or an MCP
 * server's question as a form answered Accept, Decline or Cancel, as in the inbox): a
 * request that changed since the view was drawn, or was asked again identically (a new id),
 * is refused (409) and said, never decided in its place. A view saved before it carried the
 * id is bound to the id of the request waiting now with that digest. One decided
 * elsewhere meanwhile (a decision is written once) shows that decision instead. After a
 * decision it says who decided and that the cell must be re-run for the run to continue
 * (or that the kernel took it, when a live kernel watches the parked run).
 *
 * The extension's CSS shows that saved view in place of a live panel whose kernel stopped
 * (restarted: ipywidgets marks the panel disconnected; shut down or dead: the notebook is
 * marked `dnr-kernel-gone` here), so the buttons are where the dead ones were.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { ISignal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import {
  answerButtons,
  argumentsForm,
  decisionVerdict,
  elicitation,
  elicitationForm
} from './answers';
import { api, APIError, IAnswer, IDecision, IRunSummary } from './api';
import { button, h } from './dom';

/** What is read of a notebook panel's session (structural: no notebook dependency). */
interface IKernelHolder extends Widget {
  sessionContext?: {
    session: { kernel: { status: string } | null } | null;
    statusChanged: ISignal<unknown, unknown>;
    kernelChanged: ISignal<unknown, unknown>;
  };
}

/** Set on a notebook panel whose kernel is shut down or dead (the CSS keys on it). */
const KERNEL_GONE = 'dnr-kernel-gone';

/** What a decision note tells: the verdict (an answer's, when it answers a question), who. */
type IVerdict = Pick<IDecision, 'approved' | 'by' | 'answer' | 'args' | 'message'> & {
  note?: string | null;
};

/** Set on a `.dnb-decide-here` element once it has its controls (the CSS keys on it). */
const MOUNTED = 'dnr-decide-mounted';

/** "approved by ana; re-run its cell to continue". */
function decidedText(decision: IVerdict, taken: boolean): string {
  const { verdict } = decisionVerdict({ ...decision, note: decision.note ?? null });
  const by = decision.by ? ` by ${decision.by}` : '';
  const next = taken ? 'the run resumes in its kernel' : 're-run its cell to continue';
  return `${verdict}${by}; ${next}`;
}

/** A link that opens the run's view (index.ts handles clicks on `data-durable-nb-run`). */
function runLink(id: string): HTMLElement {
  return h('a', { href: '#', class: 'dnr-run-link', 'data-durable-nb-run': id }, 'Durable runs');
}

function say(host: HTMLElement, cls: string, ...parts: (Node | string)[]): void {
  host.replaceChildren(h('div', { class: cls }, ...parts));
}

/** The run `id` as a journal this server knows has it, waiting for approval, or null. */
async function waitingRun(id: string): Promise<IRunSummary | null> {
  const found = await api.runs({ q: id, status: 'waiting_approval', limit: 500 });
  const runs = found.runs.filter(run => run.run_id === id);
  return runs.length ? runs[0] : null;
}

/** The request a saved view shows: its digest (a prefix) and its id, when the view has it. */
interface IShown {
  digest: string;
  requestId: string | null;
}

/** Whether `run` still asks the request the saved view shows. */
function asksShown(run: IRunSummary, shown: IShown): boolean {
  const pending = run.pending_approval;
  return (
    !!pending?.digest.startsWith(shown.digest) &&
    (shown.requestId === null || pending.id === shown.requestId)
  );
}

function showDecided(host: HTMLElement, decision: IVerdict, taken: boolean): void {
  const verdict = decision.approved ? 'approved' : 'rejected';
  const text = h('div', { class: 'dnr-decided-text' }, decidedText(decision, taken));
  say(host, `dnr-decided dnr-decided-${verdict}`, text);
}

/** Give one `.dnb-decide-here` element its controls, as the run stands now. */
async function mount(host: HTMLElement): Promise<void> {
  host.classList.add(MOUNTED);
  const id = host.dataset.durableNbDecide ?? '';
  const digest = (host.dataset.durableNbDigest ?? '').toLowerCase();
  if (!id || digest.length < 8) {
    return;
  }
  const shown: IShown = { digest, requestId: host.dataset.durableNbRequest || null };
  let run: IRunSummary | null;
  try {
    run = await waitingRun(id);
  } catch (error) {
    const why = (error as Error).message;
    say(host, 'dnr-error', `Deciding here needs the server's durable_nb extension: ${why}`);
    return;
  }
  if (!run || !asksShown(run, shown)) {
    say(
      host,
      'dnr-muted',
      `${id} no longer waits for this request (decided and resumed, changed or ` +
        'cancelled): see it as it is now in ',
      runLink(id),
      '.'
    );
    return;
  }
  const earlier = run.decision;
  if (earlier && (!earlier.digest || earlier.digest === run.pending_approval!.digest)) {
    showDecided(host, earlier, false);
    return;
  }
  const journal = run.journal;
  /** The decision given on the request shown since it was mounted, or null. */
  const standing = async (): Promise<IDecision | null> => {
    try {
      const now = await waitingRun(id);
      const given = now && asksShown(now, shown) ? now.decision : null;
      return given && (!given.digest || given.digest.startsWith(digest)) ? given : null;
    } catch {
      return null;
    }
  };
  const pending = run.pending_approval!;
  const act = async (approved: boolean, note: string, given: () => IAnswer): Promise<void> => {
    try {
      const answer = given();
      const reply = await api.decide(
        { journal, run_id: id },
        { ...pending, digest, id: shown.requestId ?? pending.id },
        approved,
        note,
        answer
      );
      showDecided(
        host,
        {
          approved,
          by: reply.by,
          answer: answer.answer,
          args: answer.args as Record<string, unknown> | undefined,
          message: answer.message
        },
        reply.taken
      );
    } catch (error) {
      // Refused because it was decided elsewhere meanwhile: that decision stands, and is
      // shown in place of the buttons.
      const stands = error instanceof APIError && error.status === 409 ? await standing() : null;
      if (stands) {
        showDecided(host, stands, false);
        return;
      }
      host.querySelector('.dnr-error')?.remove();
      host.append(
        h('div', { class: 'dnr-error' }, `Nothing was decided: ${(error as Error).message}`)
      );
    }
  };
  const where = h(
    'div',
    { class: 'dnr-muted' },
    'No kernel needed: decide here through the Jupyter server, or in ',
    runLink(id),
    '.'
  );
  const question = elicitation(pending);
  if (question) {
    const asked = elicitationForm(question);
    host.replaceChildren(
      h(
        'div',
        { class: 'dnr-decide-here' },
        where,
        asked.form,
        answerButtons(action => act(action === 'accept', '', () => asked.answer(action)))
      )
    );
    return;
  }
  const edits = pending.editable ? argumentsForm(pending) : null;
  const note = h('input', {
    class: 'dnr-note',
    type: 'text',
    placeholder: 'note (optional, recorded with the decision)'
  });
  const decide = (approved: boolean) =>
    act(approved, note.value, () => (edits ? edits.answer(approved) : {}));
  host.replaceChildren(
    h(
      'div',
      { class: 'dnr-decide-here' },
      where,
      edits ? edits.form : null,
      h(
        'div',
        { class: 'dnr-actions' },
        note,
        button('Approve', 'dnr-approve', () => decide(true)),
        button('Reject', 'dnr-reject', () => decide(false))
      )
    )
  );
  hideArgumentsShown(host, pending);
}

/**
 * A tool call's details (its tool and arguments only) are in the form to edit now: the
 * saved view's read-only copy above it goes, so the arguments are shown once.
 */
function hideArgumentsShown(host: HTMLElement, pending: IRunSummary['pending_approval']): void {
  const details = pending?.details;
  if (!pending?.editable || !details || typeof details !== 'object') {
    return;
  }
  if (Object.keys(details).some(key => key !== 'tool' && key !== 'arguments')) {
    return;
  }
  const shown = host.parentElement?.querySelector<HTMLElement>(':scope > pre.dnb-details');
  if (shown) {
    shown.style.display = 'none';
  }
}

/**
 * Keep `KERNEL_GONE` on the notebook panel whose node is `node` while it has no live
 * kernel: ipywidgets marks a panel's views disconnected when its kernel restarts, not
 * when it is shut down.
 */
function followKernel(app: JupyterFrontEnd, node: HTMLElement, followed: Set<string>): void {
  if (!node.id || followed.has(node.id)) {
    return;
  }
  const holder = Array.from(app.shell.widgets('main')).find(
    widget => widget.id === node.id
  ) as IKernelHolder | undefined;
  const session = holder?.sessionContext;
  if (!holder || !session) {
    return;
  }
  followed.add(node.id);
  const update = (): void => {
    const kernel = session.session?.kernel;
    holder.node.classList.toggle(KERNEL_GONE, !kernel || kernel.status === 'dead');
  };
  session.statusChanged.connect(update);
  session.kernelChanged.connect(update);
  holder.disposed.connect(() => followed.delete(node.id));
  update();
}

/**
 * Mount every `.dnb-decide-here` element of the page, now and as outputs appear (at most
 * one scan per animation frame, whatever the number of DOM changes), and follow the
 * kernels of the notebooks that show one.
 */
export function watchDecideHere(app: JupyterFrontEnd): void {
  let scheduled = false;
  const followed = new Set<string>();
  const scan = (): void => {
    scheduled = false;
    document
      .querySelectorAll<HTMLElement>(`.dnb-decide-here:not(.${MOUNTED})`)
      .forEach(element => {
        const notebook = element.closest<HTMLElement>('.jp-NotebookPanel');
        if (notebook) {
          followKernel(app, notebook, followed);
        }
        void mount(element);
      });
  };
  new MutationObserver(() => {
    if (!scheduled) {
      scheduled = true;
      requestAnimationFrame(scan);
    }
  }).observe(document.body, { childList: true, subtree: true });
  scan();
}
