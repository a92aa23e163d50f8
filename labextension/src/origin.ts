/**
 * Where a run comes from, as a sidebar row says it: two runs both called "weather" must not
 * look alike. A row names its notebook (the file's name; more of its path only where two
 * listed notebooks share a name) and, where the listed runs come from more than one
 * journal, its journal by where it is (the server's `journal_name`: a path relative to the
 * server's root, else the absolute path or a PostgreSQL URL without password). The full
 * paths are in the tooltip.
 */
import { IRunSummary } from './api';

/** What a row shows of a run's origin. */
export interface IOrigin {
  /** The notebook's name, or null for a run started outside a notebook. */
  notebook: string | null;
  /** Where the journal is; null while every listed run comes from one journal. */
  journal: string | null;
  /** The full notebook path and journal location, one per line. */
  tooltip: string;
}

/**
 * For each path, its shortest ending of whole parts (the last part at least) that no other
 * of `paths` ends with: "weather.ipynb", or "trips/weather.ipynb" beside "home/weather.ipynb".
 */
export function distinctEndings(paths: Iterable<string>): Map<string, string> {
  const split = new Map<string, string[]>();
  for (const path of paths) {
    split.set(path, path.split(/[\\/]+/).filter(Boolean));
  }
  const endings = new Map<string, string>();
  for (const [path, parts] of split) {
    let size = 1;
    while (size < parts.length && [...split].some(([other, theirs]) =>
      other !== path && theirs.slice(-size).join('/') === parts.slice(-size).join('/')
    )) {
      size += 1;
    }
    endings.set(path, parts.slice(-size).join('/') || path);
  }
  return endings;
}

/** The origins of the runs a listing shows (each depends on the others listed). */
export class Origins {
  private _notebooks: Map<string, string>;
  private _manyJournals: boolean;

  constructor(runs: readonly IRunSummary[]) {
    this._notebooks = distinctEndings(
      new Set(runs.map(notebookPath).filter((path): path is string => path !== null))
    );
    this._manyJournals = new Set(runs.map(run => run.journal)).size > 1;
  }

  of(run: IRunSummary): IOrigin {
    const path = notebookPath(run);
    const location = journalLocation(run);
    return {
      notebook: path === null ? null : (this._notebooks.get(path) ?? path),
      journal: this._manyJournals ? (run.journal_name ?? location) : null,
      tooltip:
        `Notebook: ${path ?? 'none (started outside a notebook)'}\n` +
        `Journal: ${location}`
    };
  }
}

function notebookPath(run: IRunSummary): string | null {
  return run.notebook_path || run.notebook || null;
}

function journalLocation(run: IRunSummary): string {
  return run.journal_location || run.journal;
}
