/**
 * durable-nb's JupyterLab and Notebook 7 extension: the "Durable runs" sidebar, the approvals
 * inbox and the run view, all over the server extension's REST API
 * (`{base_url}durable-nb/api/`), so they work with no kernel running.
 *
 * The sidebar, the open run views and the inbox come back after a page reload (the layout
 * restorer and a widget tracker each); the sidebar says when the server extension is missing
 * or of another version (model.ts).
 *
 * Commands: `durable-nb:open-inbox`, `durable-nb:open-sidebar`, `durable-nb:open-run`
 * ({journal, id}; without a journal, the first journal that has the run). A click on an element
 * with `data-durable-nb-run="ID"` (the kernel panel's link, shown once its kernel stopped) opens
 * that run's view; a kernel panel's pending approval gets Approve / Reject that work without
 * its kernel (decidehere.ts).
 *
 * A new pending approval shows a toast (toast.ts) whose action opens its run view.
 *
 * JupyterLab and Jupyter Notebook 7. Notebook 7's shell has no Lab shell and keeps one widget
 * in its main area (the notebook, or the file browser on the tree page): there the sidebar
 * goes to the left side area and the inbox and the run view (one at a time) to the right one,
 * each opened from the View menu's "Left Sidebar" / "Right Sidebar", the command palette, a
 * toast or a panel's link.
 */
import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, WidgetTracker } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { api } from './api';
import { IActions } from './approval';
import { watchDecideHere } from './decidehere';
import { ApprovalsInbox } from './inbox';
import { RunsModel } from './model';
import { RunView } from './runview';
import { RunsSidebar } from './sidebar';
import { RequestToasts } from './toast';

// A check mark in a circle over two lines: runs, some waiting for a person's yes.
const runsIcon = new LabIcon({
  name: 'durable-nb:runs',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<path d="M9 1.5a6 6 0 1 0 0 12 6 6 0 0 0 0-12z' +
    'm-1 8.6L5.2 7.3l1.1-1.1L8 7.9l3.7-3.7 1.1 1.1z"/>' +
    '<path d="M3 16h18v2H3zM3 20.5h12v2H3z"/>' +
    '</g></svg>'
});

/** What openNotebook needs of a notebook panel (kept structural: no notebook dependency). */
interface INotebookLike extends Widget {
  context?: { ready: Promise<void> };
  content?: {
    widgets: readonly { model: { id: string } }[];
    activeCellIndex: number;
    scrollToItem?(index: number): Promise<void>;
  };
}

/** The journal that has run `id` (the first of all the server knows), for a link without one. */
async function journalOf(id: string): Promise<string> {
  const found = await api.runs({ q: id, limit: 500, all: true });
  const run = found.runs.find(candidate => candidate.run_id === id);
  if (!run) {
    throw new Error(`no journal this server knows has the run ${id}`);
  }
  return run.journal;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'durable-nb:plugin',
  description: 'Durable runs sidebar, approvals inbox and run view',
  autoStart: true,
  optional: [ILabShell, ILayoutRestorer, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell | null,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null
  ) => {
    const inLab = labShell !== null;
    // Where a run view and the inbox open: a tab of Lab's main area; elsewhere (Notebook 7,
    // whose main area takes no second widget) the right side area.
    const viewArea = inLab ? 'main' : 'right';
    const model = new RunsModel();
    const views = new Map<string, RunView>();
    let inbox: ApprovalsInbox | null = null;
    // The open run views and the inbox, saved in the workspace: a page reload opens them again
    // (Lab's workspaces; Notebook 7 restores no such tabs).
    const runViews = new WidgetTracker<RunView>({ namespace: 'durable-nb-run' });
    const inboxes = new WidgetTracker<ApprovalsInbox>({ namespace: 'durable-nb-inbox' });
    if (restorer && inLab) {
      void restorer.restore(runViews, {
        command: 'durable-nb:open-run',
        args: view => ({ journal: view.journal, id: view.runId }),
        name: view => `${view.journal}:${view.runId}`
      });
      void restorer.restore(inboxes, { command: 'durable-nb:open-inbox', name: () => 'inbox' });
    }

    const actions: IActions & { openInbox(): void } = {
      openRun: run =>
        void app.commands.execute('durable-nb:open-run', { journal: run.journal, id: run.run_id }),
      openInbox: () => void app.commands.execute('durable-nb:open-inbox'),
      refresh: () => model.refresh(),
      openNotebook: async (path, cellId) => {
        const widget = (await app.commands.execute('docmanager:open', { path })) as INotebookLike;
        const notebook = widget?.content;
        if (!cellId || !notebook || !widget.context) {
          return;
        }
        await widget.context.ready;
        const index = notebook.widgets.findIndex(cell => cell.model.id === cellId);
        if (index >= 0) {
          notebook.activeCellIndex = index;
          await notebook.scrollToItem?.(index);
        }
      }
    };

    app.commands.addCommand('durable-nb:open-run', {
      label: 'Open a durable run',
      execute: async args => {
        const id = String(args.id);
        const journal = args.journal ? String(args.journal) : await journalOf(id);
        const key = `${journal}\n${id}`;
        let view = views.get(key);
        if (!view || view.isDisposed) {
          if (!inLab) {
            // One run view in a side area: the one shown before gives way.
            views.forEach(shown => shown.dispose());
            views.clear();
          }
          view = new RunView(journal, id, model, actions);
          view.id = `durable-nb-run-${views.size}`;
          views.set(key, view);
          app.shell.add(view, viewArea, { rank: 700 });
          void runViews.add(view);
        } else {
          void view.load();
        }
        app.shell.activateById(view.id);
      }
    });

    app.commands.addCommand('durable-nb:open-inbox', {
      label: 'Durable runs: approvals inbox',
      execute: () => {
        if (!inbox || inbox.isDisposed) {
          inbox = new ApprovalsInbox(model, actions);
          app.shell.add(inbox, viewArea, { rank: 600 });
          void inboxes.add(inbox);
        }
        app.shell.activateById(inbox.id);
      }
    });

    document.addEventListener(
      'click',
      event => {
        const link = (event.target as Element | null)?.closest?.('[data-durable-nb-run]');
        if (link) {
          event.preventDefault();
          event.stopPropagation();
          actions.openRun({ journal: '', run_id: link.getAttribute('data-durable-nb-run')! });
        }
      },
      true
    );

    watchDecideHere(app);
    new RequestToasts(model, actions);

    const sidebar = new RunsSidebar(model, actions);
    sidebar.title.icon = runsIcon;
    if (!inLab) {
      // Notebook 7 names its side panels in the View menu and the palette by their label.
      sidebar.title.label = 'Durable runs';
    }
    app.shell.add(sidebar, 'left', { rank: 600 });
    restorer?.add(sidebar, 'durable-nb-sidebar');

    app.commands.addCommand('durable-nb:open-sidebar', {
      label: 'Durable runs: show the sidebar',
      execute: () => app.shell.activateById(sidebar.id)
    });
    palette?.addItem({ command: 'durable-nb:open-inbox', category: 'Durable runs' });
    palette?.addItem({ command: 'durable-nb:open-sidebar', category: 'Durable runs' });
  }
};

export default plugin;
