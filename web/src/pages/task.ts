import { Code, ConnectError } from "@connectrpc/connect";
import { type Task, type TaskEvent, TaskState } from "../../../gen/meshwork/v1/task_pb.js";
import { type Abilities, artifacts, isAbort, tasks, whatMayI } from "../api.js";
import { fill, h } from "../dom.js";
import { ago, bytes, durationMs, exact, meter, ms, span, statePill, terminal } from "../format.js";
import { act, empty, notFound, type Page } from "../page.js";
import { schedulingRows, waitingList } from "./scheduling.js";
import { artifactTable, or, resultValueRow, row, workflowRows } from "./task-fields.js";
import { logPanel } from "./task-logs.js";

/** Errors after which WatchTask is called again (others, like not_found, are final). */
const retryable = new Set([
  Code.Unavailable,
  Code.Unknown,
  Code.Internal,
  Code.DeadlineExceeded,
  Code.ResourceExhausted,
  Code.Aborted,
]);

/** One event of the stored history (ListTaskEvents), in words. */
function eventText(e: TaskEvent): string {
  const parts: string[] = [];
  if (e.attempt) parts.push(`attempt ${e.attempt}`);
  if (e.workerId) parts.push(`worker ${e.workerId.slice(0, 8)}`);
  if (e.errorCode) parts.push(`${e.errorCode}${e.errorMessage ? `: ${e.errorMessage}` : ""}`);
  return parts.length ? parts.join(" · ") : "created";
}

/** One task, live through WatchTask: every field, lease, progress, error, artifacts, history; cancel and retry. */
export function taskPage(page: Page, taskId: string): void {
  page.title(`Task ${taskId.slice(0, 8)}`);
  const head = h("div", { class: "task-head" });
  const fields = h("dl", { class: "fields" });
  const lease = h("dl", { class: "fields" });
  const waiting = h("section", { class: "panel", id: "waiting-panel", hidden: true });
  const history = h("ol", { class: "history", id: "history" });
  const files = h("div");
  const live = h("span", { class: "live" }, "connecting…");
  fill(
    page.el,
    h(
      "p",
      { class: "crumbs" },
      h("a", { href: "#/tasks" }, "Tasks"),
      " / ",
      h("code", null, taskId),
      " · ",
      h(
        "a",
        { href: `#/tasks/${encodeURIComponent(taskId)}/workflow`, id: "workflow-link" },
        "Workflow graph",
      ),
    ),
    head,
    h(
      "div",
      { class: "cols" },
      h("section", { class: "panel" }, h("h2", null, "Task"), fields),
      h(
        "div",
        null,
        waiting,
        h("section", { class: "panel" }, h("h2", null, "Lease and progress"), lease),
        h("section", { class: "panel" }, h("h2", null, "History ", live), history),
      ),
    ),
    h("section", { class: "panel" }, h("h2", null, "Artifacts"), files),
    logPanel(page, taskId),
  );

  let last: Task | undefined;
  let watching = false;

  const renderHistory = (events: TaskEvent[]) => {
    if (!events.length) {
      fill(
        history,
        empty(
          "No history recorded.",
          "This task was created before the coordinator kept task histories; its next change will be the first.",
        ),
      );
      return;
    }
    fill(
      history,
      ...events.map((e) => {
        const at = ms(e.time) ?? 0;
        return h(
          "li",
          null,
          h(
            "time",
            { title: new Date(at).toISOString() },
            new Date(at).toLocaleTimeString([], { hourCycle: "h23" }),
          ),
          statePill(e.state),
          h("span", null, eventText(e)),
        );
      }),
    );
  };

  /** The stored history (ListTaskEvents), read again after each change the stream brings. */
  let reading = false;
  let readAgain = false;
  const loadHistory = (): void => {
    if (reading) {
      readAgain = true;
      return;
    }
    reading = true;
    void (async () => {
      const all: TaskEvent[] = [];
      let pageToken = "";
      do {
        const r = await tasks.listTaskEvents(
          { taskId, pageSize: 1000, pageToken },
          { signal: page.signal },
        );
        all.push(...r.events);
        pageToken = r.nextPageToken;
      } while (pageToken !== "" && all.length < 10_000);
      renderHistory(all);
    })()
      .catch((e: unknown) => {
        if (!isAbort(e)) page.error(e);
      })
      .finally(() => {
        reading = false;
        if (readAgain) {
          readAgain = false;
          loadHistory();
        }
      });
  };

  const loadArtifacts = async () => {
    const r = await artifacts.listArtifacts({ taskId, pageSize: 1000 }, { signal: page.signal });
    fill(files, artifactTable(r.artifacts, page));
  };

  let may: Abilities | undefined;
  void whatMayI().then((a) => {
    may = a;
    if (last) render(last);
  });

  const render = (t: Task) => {
    const cancel = h(
      "button",
      { class: "btn danger", type: "button", id: "cancel" },
      "Cancel task",
    );
    cancel.addEventListener("click", () => {
      if (!confirm(`Cancel task ${t.name || t.taskId}?`)) return;
      void act(cancel, page, async () => {
        const r = await tasks.cancelTask({ taskId, reason: "canceled from the dashboard" });
        if (r.task) update(r.task);
      });
    });
    const retry = h(
      "button",
      { class: "btn", type: "button", id: "retry" },
      "Retry on another worker",
    );
    retry.addEventListener("click", () => {
      if (!confirm(`Retry task ${t.name || t.taskId} on another worker (a new attempt)?`)) return;
      void act(retry, page, async () => {
        const r = await tasks.retryTask({ taskId });
        if (r.task) update(r.task);
        watch();
      });
    });
    const rerun = h("button", { class: "btn primary", type: "button", id: "rerun" }, "Run again");
    rerun.addEventListener("click", () => {
      if (!confirm(`Run task ${t.name || t.taskId} again (same id, a fresh attempt budget)?`))
        return;
      void act(rerun, page, async () => {
        const r = await tasks.rerunTask({ taskId });
        if (r.task) update(r.task);
        watch();
      });
    });
    // Only what the token may do and what can work for this task: rerun a
    // FAILED or CANCELED one; retry on another worker only a pushed task
    // (placed with an API base URL); cancel one that is not finished.
    const actions: HTMLButtonElement[] = [];
    if (may?.manageTasks) {
      if (t.state === TaskState.FAILED || t.state === TaskState.CANCELED) actions.push(rerun);
      const pushed = t.assignedApiBaseUrl !== "";
      if (pushed && [TaskState.ASSIGNED, TaskState.RUNNING, TaskState.FAILED].includes(t.state)) {
        actions.push(retry);
      }
      if (!terminal.has(t.state)) actions.push(cancel);
    }
    fill(
      head,
      h(
        "h1",
        null,
        t.name || "(unnamed task)",
        " ",
        h("span", { id: "task-state" }, statePill(t.state)),
      ),
      h("div", { class: "task-actions" }, ...actions),
    );
    const steps = t.steps ?? 0;
    const done = t.progress?.completedSteps ?? 0;
    const params = t.parameters ? JSON.stringify(t.parameters, null, 2) : "";
    fill(
      fields,
      row("Id", h("code", null, t.taskId)),
      row("Workload", or(t.workload)),
      row(
        "State",
        statePill(t.state),
        t.cancelRequested &&
          !terminal.has(t.state) &&
          h("span", { class: "pill drained" }, "CANCEL REQUESTED"),
      ),
      row("Attempt", `${t.attempt} of ${t.maxAttempts}`),
      row("Priority", String(t.priority)),
      ...workflowRows(t, page),
      ...schedulingRows(t).map(([label, text]) => row(label, text)),
      row("Required capabilities", or(t.requiredCapabilities.join(", "))),
      row(
        "Affinity",
        or(
          Object.entries(t.affinity)
            .map(([k, v]) => `${k}=${v}`)
            .join(", "),
        ),
      ),
      row(
        "Correlation id",
        t.correlationId &&
          h(
            "a",
            { href: `#/tasks?correlation=${encodeURIComponent(t.correlationId)}` },
            h("code", null, t.correlationId),
          ),
      ),
      row("Idempotency key", t.idempotencyKey && h("code", null, t.idempotencyKey)),
      row("Lease seconds", String(t.leaseSeconds)),
      row(
        "Retry backoff",
        t.retryBackoff &&
          `${span(durationMs(t.retryBackoff.initial))} × ${t.retryBackoff.multiplier}, at most ${span(durationMs(t.retryBackoff.max))}`,
      ),
      row("Deadline", t.deadline && exact(t.deadline)),
      row("Not before", t.notBefore && exact(t.notBefore)),
      row("Parameters", params && params !== "{}" && h("pre", null, params)),
      row("Input", t.input && `${t.input.artifactId.slice(0, 8)} · ${bytes(t.input.sizeBytes)}`),
      row(
        "Result",
        t.result && `${t.result.artifactId.slice(0, 8)} · ${bytes(t.result.sizeBytes)}`,
      ),
      row("Result summary", or(t.resultSummary)),
      resultValueRow(t),
      row(
        "Metrics",
        or(
          Object.entries(t.metrics)
            .map(([k, v]) => `${k}=${v}`)
            .join(", "),
        ),
      ),
      row("Checkpoint", t.checkpointHandle && h("code", null, t.checkpointHandle)),
      row("Created", exact(t.createdAt)),
      row("Updated", exact(t.updatedAt)),
      row("Started", t.startedAt && exact(t.startedAt)),
      row("Finished", t.finishedAt && exact(t.finishedAt)),
    );
    fill(
      lease,
      row("Assigned worker", t.assignedWorkerId && h("code", null, t.assignedWorkerId)),
      row("Worker API", or(t.assignedApiBaseUrl)),
      // A lease shows as live only while it holds; after, when it really ended.
      row(
        t.lease?.endedAt ? "Last lease holder" : "Lease holder",
        t.lease?.workerId && h("code", null, t.lease.workerId),
      ),
      t.lease?.endedAt
        ? row("Lease ended", `${exact(t.lease.endedAt)} (${ago(t.lease.endedAt)})`)
        : row(
            "Lease expires",
            t.lease?.expiresAt && `${exact(t.lease.expiresAt)} (${ago(t.lease.expiresAt)})`,
          ),
      row(
        "Progress",
        t.progress || steps
          ? h(
              "span",
              null,
              steps ? `${done} / ${steps} steps` : `${done} steps`,
              steps > 0 && meter(done / steps, true),
              t.progress?.message && h("div", null, t.progress.message),
            )
          : undefined,
      ),
      row(
        "Error",
        t.error?.code &&
          h(
            "span",
            { class: "error-text" },
            h("strong", null, t.error.code),
            ": ",
            t.error.message,
          ),
      ),
    );
  };

  /** Why a PENDING task waits (GetTask), read again at most every 3 s while it does. */
  let waitingReadAt = 0;
  function explain(t: Task): void {
    waiting.hidden = t.state !== TaskState.PENDING;
    if (waiting.hidden || Date.now() - waitingReadAt < 3000) return;
    waitingReadAt = Date.now();
    void tasks.getTask({ taskId }, { signal: page.signal }).then(
      (r) => fill(waiting, h("h2", null, "Why it waits"), waitingList(r.waiting, r.queuePosition)),
      (e) => !isAbort(e) && page.error(e),
    );
  }
  page.every(3000, async () => {
    if (last) explain(last);
  });

  function update(t: Task): void {
    explain(t);
    const changedState = last?.state !== t.state;
    if (changedState || last?.attempt !== t.attempt) loadHistory();
    last = t;
    render(t);
    if (changedState) void loadArtifacts().catch((e) => !isAbort(e) && page.error(e));
  }

  /** Follows WatchTask until the task ends; reconnects after an interruption. */
  function watch(): void {
    if (watching) return;
    watching = true;
    void (async () => {
      for (let delay = 1000; !page.signal.aborted; delay = Math.min(delay * 2, 10_000)) {
        try {
          live.textContent = "● live";
          live.className = "live on";
          for await (const r of tasks.watchTask({ taskId }, { signal: page.signal })) {
            if (r.task) update(r.task);
            page.error("");
            delay = 1000;
          }
          break; // The stream ends when the task does.
        } catch (e) {
          if (page.signal.aborted || isAbort(e)) break;
          const code = ConnectError.from(e).code;
          // No such task (or not a task id): a not-found page, not empty cards.
          if (!last && (code === Code.NotFound || code === Code.InvalidArgument)) {
            notFound(page, `There is no task ${JSON.stringify(taskId.slice(0, 64))}.`);
            watching = false;
            return;
          }
          page.error(e);
          if (!retryable.has(code)) {
            live.textContent = "";
            watching = false;
            return;
          }
          live.textContent = "reconnecting…";
          live.className = "live";
          await new Promise((r) => setTimeout(r, delay));
        }
      }
      watching = false;
      if (!page.signal.aborted) {
        live.textContent = last && terminal.has(last.state) ? "finished" : "stopped";
        live.className = "live";
        void loadArtifacts().catch(() => {});
      }
    })();
  }
  watch();
}
