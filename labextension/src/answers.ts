/**
 * Answers beyond yes or no, as forms every view that decides shares (the inbox and run view
 * cards, approval.ts; the saved view's "decide here", decidehere.ts):
 *
 * - a tool call's arguments, editable as JSON, and a message for the model on Reject;
 * - an MCP server's question (elicitation: `details.kind == "elicitation"`), its message and
 *   one field per property of its flat JSON schema (a multi-select as checkboxes), answered
 *   Accept (with the fields' content), Decline or Cancel. The answer is the decision's
 *   `answer` (`{action, content}`), beside its note.
 *
 * Whether an answer fits its schema is the server's to say (one line, nothing decided); the
 * browser's own checks (required, min/max, lengths, pattern) only spare a round trip. The
 * message, titles and descriptions come from outside (a model, an MCP server): they are put
 * in the page as text (dom.ts `h`), never as HTML.
 */
import { IAnswer, IDecision, IPending } from './api';
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
  anyOf?: { const?: unknown; title?: string }[];
  /** A multi-select (`type: "array"`): the choices, as an enum or titled consts. */
  items?: IProperty;
  minItems?: number;
  maxItems?: number;
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

/** How each answer to an MCP server's question reads. */
const ANSWERED: Record<string, string> = {
  accept: 'accepted',
  decline: 'declined',
  cancel: 'cancelled'
};

/**
 * How an answer to an MCP server's question reads ("accepted", "declined", "cancelled"):
 * `given` is the decision's `answer` (`{action, content}`), or the note of a decision written
 * before answers were decision content (durable_nb 29bcdb7), which held the answer as JSON.
 * Null for anything else (a plain note, no answer).
 */
export function answerVerdict(given: unknown): string | null {
  let answer = given;
  if (typeof given === 'string') {
    if (!given.startsWith('{')) {
      return null;
    }
    try {
      answer = JSON.parse(given);
    } catch {
      return null;
    }
  }
  const action = (answer as { action?: unknown } | null | undefined)?.action;
  return typeof action === 'string' && action in ANSWERED ? ANSWERED[action] : null;
}

/** The most characters of edited arguments or of a message a verdict quotes. */
const CONTENT_SHOWN = 300;

/** `value` as JSON spaced as Python's json.dumps spaces it (`{"a": 1, "b": [2, 3]}`), so
 * the sidebar quotes a decision as the CLI, `show` and the panel do. */
function spacedJson(value: unknown): string {
  if (Array.isArray(value)) {
    return `[${value.map(spacedJson).join(', ')}]`;
  }
  if (value && typeof value === 'object') {
    const items = Object.entries(value as Record<string, unknown>).map(
      ([key, item]) => `${JSON.stringify(key)}: ${spacedJson(item)}`
    );
    return `{${items.join(', ')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

/** `value` as JSON, cut to CONTENT_SHOWN characters. */
function quoted(value: unknown): string {
  const text = spacedJson(value);
  return text.length <= CONTENT_SHOWN ? text : `${text.slice(0, CONTENT_SHOWN - 1)}\u2026`;
}

/** How a decision reads: its answer's verdict, an old journal's answer in the note, or
 * approved / rejected with what it says beyond that (`approved with edited arguments
 * {...}`, `rejected with the message "..."`, as the CLI says it); and its note when that
 * is a note (not an old answer). */
export function decisionVerdict(
  decision: Pick<IDecision, 'approved' | 'note' | 'answer' | 'args' | 'message'>
): { verdict: string; note: string | null } {
  const fromAnswer = answerVerdict(decision.answer);
  const fromNote = fromAnswer ? null : answerVerdict(decision.note);
  let said = decision.approved ? 'approved' : 'rejected';
  if (decision.args !== undefined && decision.args !== null) {
    said += ` with edited arguments ${quoted(decision.args)}`;
  } else if (decision.message) {
    said += ` with the message ${quoted(decision.message)}`;
  }
  const verdict = fromAnswer ?? fromNote ?? said;
  return { verdict, note: fromNote ? null : decision.note || null };
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

/** The choices of an enum property (of its `items` for a multi-select): its values and
 * what each is called, as Python's `QuestionField.choices` reads them. */
function choices(property: IProperty): { value: unknown; label: string }[] | null {
  const schema = property.type === 'array' && property.items ? property.items : property;
  if (Array.isArray(schema.enum)) {
    const names =
      Array.isArray(schema.enumNames) && schema.enumNames.length === schema.enum.length
        ? schema.enumNames
        : null;
    return schema.enum.map((value, index) => ({
      value,
      label: names ? String(names[index]) : String(value)
    }));
  }
  const branches = schema.oneOf ?? schema.anyOf;
  if (
    Array.isArray(branches) &&
    branches.length &&
    branches.every(one => one && typeof one === 'object' && 'const' in one)
  ) {
    return branches.map(one => ({ value: one.const, label: String(one.title ?? one.const) }));
  }
  return null;
}

/**
 * A multi-select: a checkbox per choice (those in the default checked), read as the array
 * of the checked choices' values; a required one, or one with `minItems`/`maxItems`, says
 * so when too few or too many are checked.
 */
function checkboxes(
  name: string,
  title: string,
  property: IProperty,
  options: { value: unknown; label: string }[],
  required: boolean
): { input: HTMLElement; read: () => unknown } {
  const chosen = Array.isArray(property.default) ? property.default : [];
  const boxes = options.map(option => {
    const box = h('input', { type: 'checkbox', class: 'dnr-choice' });
    box.checked = chosen.some(value => value === option.value);
    return box;
  });
  const input = h(
    'div',
    { class: 'dnr-field dnr-choices', role: 'group', 'data-name': name, 'aria-label': title },
    ...options.map((option, index) =>
      h('label', { class: 'dnr-choice-label' }, boxes[index], option.label)
    )
  );
  const read = (): unknown => {
    const values = options.filter((_, index) => boxes[index].checked).map(one => one.value);
    const fewest = Math.max(property.minItems ?? 0, required ? 1 : 0);
    if (values.length < fewest) {
      throw new Error(`${title}: choose at least ${fewest}`);
    }
    if (property.maxItems !== undefined && values.length > property.maxItems) {
      throw new Error(`${title}: choose at most ${property.maxItems}`);
    }
    return values.length || required ? values : undefined;
  };
  return { input, read };
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
  if (options && property.type === 'array') {
    const many = checkboxes(name, title, property, options, required);
    const legend = h('div', { class: 'dnr-field-title', id }, title, required ? ' *' : '');
    return { row: h('div', { class: 'dnr-field-row' }, legend, many.input, hint), read: many.read };
  }
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
