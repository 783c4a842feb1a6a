import { Code, ConnectError } from "@connectrpc/connect";
import type { LogLine } from "../../../gen/meshwork/v1/task_pb.js";
import { isAbort, tasks } from "../api.js";
import { h } from "../dom.js";
import type { Page } from "../page.js";

/** The most lines the live tail shows; older ones leave the page. */
const shownLines = 2000;

/** Errors after which WatchTaskLogs is called again, from the last line seen. */
const retryable = new Set([
  Code.Unavailable,
  Code.Unknown,
  Code.Internal,
  Code.DeadlineExceeded,
  Code.ResourceExhausted,
  Code.Aborted,
]);

/**
 * The task's log, live: the kept lines, then each new batch (WatchTaskLogs,
 * a server stream over fetch), until the task ends. Reconnects after an
 * interruption from the last line shown. Lines are text nodes, never HTML.
 */
export function logPanel(page: Page, taskId: string): HTMLElement {
  const state = h("span", { class: "live" }, "connecting…");
  const pre = h("pre", { class: "log-tail", id: "log-tail" });
  const none = h("p", { class: "muted" }, "No log lines yet.");
  const panel = h("section", { class: "panel" }, h("h2", null, "Logs ", state), none, pre);
  let after = 0n;
  let count = 0;

  const add = (lines: LogLine[]) => {
    if (lines.length === 0) return;
    none.hidden = true;
    const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    for (const l of lines) {
      const line = h(
        "span",
        { class: l.stream === "stderr" ? "stderr" : undefined },
        `${l.text}\n`,
      );
      pre.append(line);
      count++;
    }
    while (count > shownLines && pre.firstChild) {
      pre.firstChild.remove();
      count--;
    }
    after = lines[lines.length - 1]?.sequence ?? after;
    if (stick) pre.scrollTop = pre.scrollHeight;
  };

  void (async () => {
    for (let delay = 1000; !page.signal.aborted; delay = Math.min(delay * 2, 10_000)) {
      try {
        state.textContent = "● live";
        state.className = "live on";
        for await (const r of tasks.watchTaskLogs(
          { taskId, afterSequence: after },
          { signal: page.signal },
        )) {
          add(r.lines);
          delay = 1000;
        }
        state.textContent = "finished";
        state.className = "live";
        return; // The stream ends when the task does.
      } catch (e) {
        if (page.signal.aborted || isAbort(e)) return;
        const code = ConnectError.from(e).code;
        if (!retryable.has(code)) {
          // Not found, or this token may not read logs: the task page says the rest.
          state.textContent = code === Code.PermissionDenied ? "not allowed" : "";
          state.className = "live";
          return;
        }
        state.textContent = "reconnecting…";
        state.className = "live";
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  })();
  return panel;
}
