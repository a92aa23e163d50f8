/**
 * durable-nb's JupyterLab extension: the "Durable runs" sidebar (restored across
 * reloads), the approvals inbox and the run view, all over the server extension's REST
 * API (`{base_url}durable-nb/api/`), so they work with no kernel running.
 *
 * Commands: `durable-nb:open-inbox`, `durable-nb:open-run` ({journal, id}).
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { IActions } from './approval';
import { ApprovalsInbox } from './inbox';
import { RunsModel } from './model';
import { RunView } from './runview';
import { RunsSidebar } from './sidebar';

const runsIcon = new LabIcon({
  name: 'durable-nb:runs',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<path d="M4 4h3v3H4zM9 4.75h11v1.5H9zM4 10.5h3v3H4zM9 11.25h11v1.5H9zM4 17h3v3H4zM9 17.75h11v1.5H9z"/>' +
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

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'durable-nb:plugin',
  description: 'Durable runs sidebar, approvals inbox and run view',
  autoStart: true,
  optional: [ILayoutRestorer],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null) => {
    const model = new RunsModel();
    const views = new Map<string, RunView>();
    let inbox: ApprovalsInbox | null = null;

    const actions: IActions & { openInbox(): void } = {
      openRun: run => void app.commands.execute('durable-nb:open-run', { journal: run.journal, id: run.run_id }),
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
      execute: args => {
        const journal = String(args.journal);
        const id = String(args.id);
        const key = `${journal}\n${id}`;
        let view = views.get(key);
        if (!view || view.isDisposed) {
          view = new RunView(journal, id, model, actions);
          view.id = `durable-nb-run-${views.size}`;
          views.set(key, view);
          app.shell.add(view, 'main');
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
          app.shell.add(inbox, 'main');
        }
        app.shell.activateById(inbox.id);
      }
    });

    const sidebar = new RunsSidebar(model, actions);
    sidebar.title.icon = runsIcon;
    app.shell.add(sidebar, 'left', { rank: 600 });
    restorer?.add(sidebar, 'durable-nb-sidebar');
  }
};

export default plugin;
