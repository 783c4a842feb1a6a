/** A child h() accepts: nodes, text, or nothing (skipped). */
export type Child = Node | string | number | null | undefined | false | Child[];

type Attrs = Record<string, string | number | boolean | undefined | EventListener>;

/**
 * Creates an element: `h("a", { href: "#/tasks", class: "link" }, "Tasks")`.
 * Attributes named `on<event>` become listeners; `false`/`undefined` skip an
 * attribute. Text is always set as text, never parsed as HTML.
 */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs | null = null,
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === false) continue;
    if (typeof value === "function") el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

/** An SVG element with attributes. */
export function s(tag: string, attrs: Record<string, string | number> = {}, ...children: Node[]) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  for (const c of children) el.append(c);
  return el;
}

function append(el: Element, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(typeof c === "number" ? String(c) : c);
  }
}

/** Replaces an element's children. */
export function fill(el: Element, ...children: Child[]): void {
  el.replaceChildren();
  append(el, children);
}
