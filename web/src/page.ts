import { describe, isAbort } from "./api.js";
import { h } from "./dom.js";

/** What a page gets: its element, the route's query, a signal that aborts when the user leaves. */
export interface Page {
  el: HTMLElement;
  params: URLSearchParams;
  signal: AbortSignal;
  /** Runs `fn` now and every `ms` while the page is shown; errors go to the page's banner. */
  every(ms: number, fn: () => Promise<void>): void;
  /**
   * Shows an RPC error readably (code: message) at the top of the page; ""
   * clears it. A refresh's error goes when a later refresh succeeds; an
   * action's (from `act`) stays until dismissed or another action succeeds.
   */
  error(error: unknown, from?: "refresh" | "action"): void;
  /** Sets the page title and the "updated" stamp. */
  title(text: string): void;
}

/** Lists refresh this often (docs/dashboard.md). */
export const refreshMs = 3000;

export function createPage(
  el: HTMLElement,
  params: URLSearchParams,
  signal: AbortSignal,
  banner: HTMLElement,
): Page {
  let shown: "refresh" | "action" | undefined;
  const page: Page = {
    el,
    params,
    signal,
    every(ms, fn) {
      let running = false;
      const tick = async () => {
        if (running || signal.aborted) return;
        running = true;
        try {
          await fn();
          if (!signal.aborted) page.error("");
        } catch (e) {
          if (!isAbort(e) && !signal.aborted) page.error(e);
        } finally {
          running = false;
        }
      };
      void tick();
      const timer = window.setInterval(tick, ms);
      signal.addEventListener("abort", () => window.clearInterval(timer), { once: true });
    },
    error(error, from = "refresh") {
      if (error === "") {
        if (shown === "action" && from === "refresh") return;
        banner.replaceChildren();
        banner.hidden = true;
        shown = undefined;
        return;
      }
      shown = from;
      const close = h(
        "button",
        { class: "banner-close", type: "button", "aria-label": "Dismiss" },
        "×",
      );
      close.addEventListener("click", () => page.error("", "action"));
      banner.hidden = false;
      banner.replaceChildren(
        h("strong", null, from === "action" ? "Refused " : "Error "),
        h("span", null, describe(error)),
        close,
      );
    },
    title(text) {
      document.title = `${text} · Meshwork`;
    },
  };
  return page;
}

/** An empty state: what is missing and what to do next. */
export function empty(title: string, ...next: (Node | string)[]) {
  return h(
    "div",
    { class: "empty" },
    h("p", { class: "empty-title" }, title),
    h("p", null, ...next),
  );
}

/**
 * Runs an action from a button: disables it meanwhile; a refusal is shown
 * right after the button, where the eye is, and announced to screen readers
 * (role=alert), until the next try of that button.
 */
export async function act(button: HTMLButtonElement, page: Page, fn: () => Promise<void>) {
  button.disabled = true;
  const next = button.nextElementSibling;
  if (next?.classList.contains("refusal")) next.remove();
  try {
    await fn();
    page.error("", "action");
  } catch (e) {
    if (isAbort(e)) return;
    const note = h(
      "span",
      { class: "refusal", role: "alert", "data-refusal-for": button.id || undefined },
      h("strong", null, "Refused: "),
      describe(e),
    );
    button.after(note);
  } finally {
    button.disabled = false;
  }
}

/** The page for a route or a thing that does not exist, with the way back. */
export function notFound(page: Page, what: string): void {
  page.title("Not found");
  page.el.replaceChildren(
    h("h1", null, "Not found"),
    empty(
      what,
      h("a", { href: "#/fleet" }, "Back to the fleet"),
      " · ",
      h("a", { href: "#/tasks" }, "Tasks"),
    ),
  );
}

/**
 * Keyset paging for a list page: the token of the page shown, the tokens of
 * the pages before it (Previous pops one), the two buttons and a
 * "page N · …" line. `reload` reads the page `token` names.
 */
export function createPager(
  page: Page,
  labels: { previous: string; next: string },
  reload: () => Promise<void>,
) {
  const before: string[] = [];
  let current = "";
  let next = "";
  const prev = h("button", { class: "btn", type: "button" }, labels.previous);
  const nextBtn = h("button", { class: "btn", type: "button" }, labels.next);
  const info = h("span", { class: "muted" });
  prev.addEventListener("click", () => {
    current = before.pop() ?? "";
    void reload().catch((e) => page.error(e));
  });
  nextBtn.addEventListener("click", () => {
    if (!next) return;
    before.push(current);
    current = next;
    void reload().catch((e) => page.error(e));
  });
  return {
    el: h("div", { class: "pager" }, prev, info, nextBtn),
    /** The page token of the page to read. */
    get token(): string {
      return current;
    },
    /** After a page was read: its next_page_token, and what it held ("3 tasks"). */
    shown(nextToken: string, what: string): void {
      next = nextToken;
      prev.disabled = before.length === 0;
      nextBtn.disabled = !next;
      info.textContent = `page ${before.length + 1} · ${what}`;
    },
  };
}
