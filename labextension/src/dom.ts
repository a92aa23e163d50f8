/**
 * Small DOM and formatting helpers shared by the views.
 *
 * Everything from a journal is put in the page as text (textContent), never as HTML:
 * a hostile journal entry shows as its characters and runs nothing.
 */
import { IRunSummary } from './api';

type Child = Node | string | null | undefined | false;

/** An element with a class, attributes and children (strings become text nodes). */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: { class?: string; title?: string; [attr: string]: string | undefined } = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined) {
      continue;
    }
    if (name === 'class') {
      element.className = value;
    } else {
      element.setAttribute(name, value);
    }
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) {
      continue;
    }
    element.append(typeof child === 'string' ? document.createTextNode(child) : child);
  }
  return element;
}

/** A button that calls `onClick` (and is disabled while its promise runs). */
export function button(
  label: string,
  cls: string,
  onClick: () => unknown | Promise<unknown>,
  title?: string
): HTMLButtonElement {
  const node = h('button', { class: `dnr-button ${cls}`, type: 'button', title }, label);
  node.addEventListener('click', async event => {
    event.stopPropagation();
    node.disabled = true;
    try {
      await onClick();
    } finally {
      node.disabled = false;
    }
  });
  return node;
}

/** The groups of the sidebar, in the order they are shown. */
export const GROUPS = [
  { key: 'waiting', label: 'Waiting for approval' },
  { key: 'decided', label: 'Decided, waiting to resume' },
  { key: 'running', label: 'Running' },
  { key: 'interrupted', label: 'Interrupted' },
  { key: 'failed', label: 'Failed' },
  { key: 'cancelled', label: 'Cancelled' },
  { key: 'done', label: 'Done' }
] as const;

export type GroupKey = (typeof GROUPS)[number]['key'];

/**
 * Which group a run is listed in: a pending approval first, whatever else is true; one
 * already decided (its kernel gone, the decision not taken yet) apart, as nobody needs to
 * look at it but to resume it.
 */
export function groupOf(run: IRunSummary): GroupKey {
  if (run.status === 'WAITING_APPROVAL') {
    return run.decision ? 'decided' : 'waiting';
  }
  if (run.interrupted && run.status !== 'DONE') {
    return 'interrupted';
  }
  switch (run.status) {
    case 'RUNNING':
      return 'running';
    case 'FAILED':
      return 'failed';
    case 'CANCELLED':
      return 'cancelled';
    default:
      return 'done';
  }
}

/** The status badge of a run (the colours of the kernel's panel). */
export function statusBadge(run: IRunSummary): HTMLElement {
  const group = groupOf(run);
  const text =
    group === 'interrupted'
      ? `${run.status} · interrupted`
      : group === 'decided'
        ? `${run.status} · decided`
        : run.status;
  return h('span', { class: `dnr-badge dnr-status-${group}` }, text);
}

/** `count` and the noun, plural when it is not 1 ("1 step", "3 steps"). */
export function plural(count: number, noun: string): string {
  return `${count.toLocaleString()} ${noun}${count === 1 ? '' : 's'}`;
}

/**
 * A moment (seconds since the epoch) as every view writes it, in the browser's time zone:
 * "2026-12-03 09:41:07", the format of durable_nb's Python side (durable_nb/timestamps.py,
 * which says why); '' when unknown. Never relative: a listing redrawn only when something
 * changes would keep "12 s ago" for hours.
 */
export function clock(ts: number | null | undefined): string {
  if (typeof ts !== 'number' || !Number.isFinite(ts)) {
    return '';
  }
  const moment = new Date(ts * 1000);
  const two = (n: number) => String(n).padStart(2, '0');
  const day = `${moment.getFullYear()}-${two(moment.getMonth() + 1)}-${two(moment.getDate())}`;
  return `${day} ${two(moment.getHours())}:${two(moment.getMinutes())}:${two(moment.getSeconds())}`;
}

/** A duration in seconds as people read it. */
export function duration(seconds: number): string {
  if (seconds < 1) {
    return `${(seconds * 1000).toFixed(1)} ms`;
  }
  if (seconds < 120) {
    return `${seconds.toFixed(1)} s`;
  }
  return `${Math.round(seconds / 60)} min`;
}

/** Dollars as durable_nb.summary.format_cost writes them (no cost shown for none or zero; two
 * significant digits under $0.0001, where four decimals would read "$0.0000"). */
export function cost(value: number | null | undefined): string {
  if (typeof value !== 'number' || !(value > 0)) {
    return '';
  }
  if (value < 0.0001) {
    return `$${value.toFixed(1 - Math.floor(Math.log10(value)))}`;
  }
  if (value < 0.01) {
    return `$${value.toFixed(4)}`;
  }
  if (value < 1) {
    return `$${value.toFixed(3)}`;
  }
  return value < 100 ? `$${value.toFixed(2)}` : `$${Math.round(value).toLocaleString('en')}`;
}

/** JSON data shown as indented text (a string stays as it is). */
export function pretty(value: unknown): string {
  if (typeof value === 'string') {
    return value;
  }
  try {
    return JSON.stringify(value, null, 2) ?? String(value);
  } catch {
    return String(value);
  }
}

/** The first 12 characters of a digest, as the panel and the CLI show it. */
export function short(digest: string | null | undefined): string {
  return (digest ?? '').slice(0, 12);
}
