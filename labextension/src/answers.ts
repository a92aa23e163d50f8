/**
 * Answers beyond yes or no, as forms every view that decides shares (the inbox and run view
 * cards, approval.ts; the saved view's "decide here", decidehere.ts):
 *
 * - a tool call's arguments, editable as JSON, and a message for the model on Reject;
 * - an MCP server's question (elicitation: `details.kind == "elicitation"`), its message and
 *   one field per property of its flat JSON schema, answered Accept (with the fields' content),
 *   Decline or Cancel.
 *
 * Whether an answer fits its schema is the server's to say (one line, nothing decided); the
 * browser's own checks (required, min/max, lengths, pattern) only spare a round trip. The
 * message, titles and descriptions come from outside (a model, an MCP server): they are put
 * in the page as text (dom.ts `h`), never as HTML.
 */
import { IAnswer, IPending } from './api';
import { button, h } from './dom';

/** The answers MCP knows for a server's question. */
export type ElicitationAction = 'accept' | 'decline' | 'cancel';

/** The details of a pending request that is an MCP server's question. */
interface IElicitation {
  kind: 'elicitation';
  message?: string;
  server?: string;
  tool?: string;
  schema?: { properties?: Record<string, IProperty>; required?: string[] };
}

/** One property of a question's schema (MCP allows flat primitives only). */
interface IProperty {
  type?: string;
  title?: string;
  description?: string;
  default?: unknown;
  minimum?: number;
  maximum?: number;
  minLength?: number;
  maxLength?: number;
  pattern?: string;
  format?: string;
  enum?: unknown[];
  enumNames?: string[];
  oneOf?: { const?: unknown; title?: string }[];
}

/** A form: its element, and the answer it gives for a click (throws, saying why, if none). */
export interface IForm<A> {
  form: HTMLElement;
  answer: (choice: A) => IAnswer;
}

/** The request's details as an MCP server's question, or null when it is not one. */
export function elicitation(pending: IPending | null | undefined): IElicitation | null {
  const details = pending?.details as IElicitation | null | undefined;
  return details && typeof details === 'object' && details.kind === 'elicitation'
    ? details
    : null;
}

/**
 * How an answer to an MCP server's question reads ("accepted", "declined", "cancelled"): its
 * decision's note is the answer as JSON. Null for any other note.
 */
export function answerVerdict(note: string | null | undefined): string | null {
  if (!note || !note.startsWith('{')) {
    return null;
  }
  try {
    const action = (JSON.parse(note) as { action?: unknown }).action;
    const said: Record<string, string> = {
      accept: 'accepted',
      decline: 'declined',
      cancel: 'cancelled'
    };
    return typeof action === 'string' && action in said ? said[action] : null;
  } catch {
    return null;
  }
}

/**
 * A tool call's arguments as JSON, editable, and a message for the model: what a click
 * sends beyond yes or no (`args` on Approve when edited, `message` on Reject when given).
 */
export function argumentsForm(pending: IPending): IForm<boolean> {
  const shown = (pending.details as { arguments: unknown }).arguments;
  const args = h('textarea', { class: 'dnr-args', rows: '4' });
  args.value = JSON.stringify(shown, null, 2);
  const message = h('input', {
    class: 'dnr-message',
    type: 'text',
    placeholder: 'message for the model, sent on Reject'
  });
  const form = h(
    'div',
    { class: 'dnr-answer' },
    h(
      'div',
      { class: 'dnr-muted' },
      'Arguments (JSON: edit them, then Approve runs the tool with them)'
    ),
    args,
    message
  );
  const answer = (approved: boolean): IAnswer => {
    if (!approved) {
      return message.value.trim() ? { message: message.value.trim() } : {};
    }
    let edited: unknown;
    try {
      edited = JSON.parse(args.value);
    } catch (error) {
      throw new Error(`the arguments are not JSON (${(error as Error).message})`);
    }
    return JSON.stringify(edited) === JSON.stringify(shown) ? {} : { args: edited };
  };
  return { form, answer };
}

/** The choices of an enum property: its values and what each is called. */
function choices(property: IProperty): { value: unknown; label: string }[] | null {
  if (Array.isArray(property.enum)) {
    return property.enum.map((value, index) => ({
      value,
      label: property.enumNames?.[index] ?? String(value)
    }));
  }
  if (Array.isArray(property.oneOf) && property.oneOf.every(one => one && 'const' in one)) {
    return property.oneOf.map(one => ({ value: one.const, label: one.title ?? String(one.const) }));
  }
  return null;
}

/** The inputs of string formats whose value is the format's own (a datetime-local input's
 * is not RFC 3339's date-time: a date-time is typed as text). */
const INPUT_TYPES: Record<string, string> = {
  email: 'email',
  uri: 'url',
  date: 'date'
};

/**
 * A schema's `pattern` as JSON Schema reads it (a match anywhere in the value, where an
 * input's `pattern` attribute must match it whole), or null when the browser cannot compile
 * it: the server's check is the one that counts.
 */
function matcher(pattern: string | undefined): RegExp | null {
  if (!pattern) {
    return null;
  }
  try {
    return new RegExp(pattern, 'u');
  } catch {
    return null;
  }
}

/** One field of a question: its row in the form and how its value is read. */
interface IField {
  row: HTMLElement;
  /** The value to send, `undefined` when left empty; throws naming the field when invalid. */
  read: () => unknown;
}

function field(name: string, property: IProperty, required: boolean): IField {
  const title = property.title || name;
  const id = `dnr-q-${name}-${Math.random().toString(36).slice(2, 10)}`;
  const label = h('label', { class: 'dnr-field-title', for: id }, title, required ? ' *' : '');
  const hint = property.description
    ? h('div', { class: 'dnr-muted dnr-field-hint' }, property.description)
    : null;
  const options = choices(property);
  const invalid = (input: HTMLInputElement | HTMLSelectElement): Error =>
    new Error(`${title}: ${input.validationMessage || 'not a valid value'}`);
  let input: HTMLInputElement | HTMLSelectElement;
  let read: () => unknown;
  if (options) {
    const select = h('select', { class: 'dnr-field', id, 'data-name': name });
    // Nothing chosen until someone chooses (a required one without a default included).
    if (!required || property.default === undefined) {
      select.append(h('option', { value: '' }, '—'));
    }
    options.forEach((option, index) => {
      const node = h('option', { value: String(index) }, option.label);
      node.selected = option.value === property.default;
      select.append(node);
    });
    input = select;
    read = () => (select.value === '' ? undefined : options[Number(select.value)].value);
  } else if (property.type === 'boolean') {
    const box = h('input', { class: 'dnr-field', id, type: 'checkbox', 'data-name': name });
    box.checked = property.default === true;
    input = box;
    read = () => box.checked;
  } else {
    const numeric = property.type === 'number' || property.type === 'integer';
    const text = h('input', {
      class: 'dnr-field',
      id,
      'data-name': name,
      type: numeric ? 'number' : (INPUT_TYPES[property.format ?? ''] ?? 'text'),
      step: property.type === 'integer' ? '1' : numeric ? 'any' : undefined,
      min: property.minimum !== undefined ? String(property.minimum) : undefined,
      max: property.maximum !== undefined ? String(property.maximum) : undefined,
      minlength: property.minLength !== undefined ? String(property.minLength) : undefined,
      maxlength: property.maxLength !== undefined ? String(property.maxLength) : undefined
    });
    if (property.default !== undefined && property.default !== null) {
      text.value = String(property.default);
    }
    input = text;
    read = () => {
      if (text.value === '') {
        return undefined;
      }
      return numeric ? Number(text.value) : text.value;
    };
  }
  input.required = required && property.type !== 'boolean';
  const pattern = matcher(property.pattern);
  const checkedRead = (): unknown => {
    if (!input.checkValidity()) {
      throw invalid(input);
    }
    const value = read();
    if (pattern && typeof value === 'string' && !pattern.test(value)) {
      throw new Error(`${title}: does not match the pattern ${property.pattern}`);
    }
    return value;
  };
  const row = h('div', { class: 'dnr-field-row' }, label, input, hint);
  return { row, read: checkedRead };
}

/**
 * An MCP server's question as a form: its message, one field per property of its schema
 * (title, description, default and limits as the schema gives them), and the answer a
 * click on Accept, Decline or Cancel gives (`answer: {action, content}`; content on Accept
 * only). Accept with a field that the browser finds invalid throws, naming the field.
 */
export function elicitationForm(question: IElicitation): IForm<ElicitationAction> {
  const properties = question.schema?.properties ?? {};
  const required = new Set(question.schema?.required ?? []);
  const fields = Object.entries(properties).map(
    ([name, property]) => [name, field(name, property ?? {}, required.has(name))] as const
  );
  const asked = [
    question.server && `server ${question.server}`,
    question.tool && `tool ${question.tool}`
  ]
    .filter(Boolean)
    .join(', ');
  const form = h(
    'div',
    { class: 'dnr-question' },
    h('div', { class: 'dnr-question-message' }, question.message ?? ''),
    asked ? h('div', { class: 'dnr-muted' }, `Asked by the MCP ${asked}`) : null,
    ...fields.map(([, one]) => one.row)
  );
  const answer = (action: ElicitationAction): IAnswer => {
    if (action !== 'accept') {
      return { answer: { action } };
    }
    const content: Record<string, unknown> = {};
    for (const [name, one] of fields) {
      const value = one.read();
      if (value !== undefined) {
        content[name] = value;
      }
    }
    return { answer: { action, content } };
  };
  return { form, answer };
}

/** Accept, Decline and Cancel, each answering with `answer(action)`. */
export function answerButtons(
  answer: (action: ElicitationAction) => Promise<void>
): HTMLElement {
  return h(
    'div',
    { class: 'dnr-actions' },
    button('Accept', 'dnr-accept dnr-approve', () => answer('accept')),
    button('Decline', 'dnr-decline dnr-reject', () => answer('decline')),
    button('Cancel', 'dnr-cancel-answer', () => answer('cancel'))
  );
}
