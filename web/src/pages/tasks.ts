import { type Task, TaskState } from "../../../gen/meshwork/v1/task_pb.js";
import { fleet, tasks, whatMayI } from "../api.js";
import { fill, h } from "../dom.js";
import {
  ms,
  shortId,
  span,
  statePill,
  taskStateName,
  taskStates,
  terminal,
  when,
} from "../format.js";
import { act, createPager, empty, type Page, refreshMs } from "../page.js";

const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** How long a task waited before it started, and how long it ran (so far, while it runs). */
function durations(t: Task, now = Date.now()) {
  const created = ms(t.createdAt);
  const started = ms(t.startedAt);
  const finished = ms(t.finishedAt);
  // finished_at is set only in a terminal state (a rerun clears it): a task
  // that finished without starting (cancelled while PENDING) waited until then.
  const queued = created === undefined ? undefined : (started ?? finished ?? now) - created;
  const running = started === undefined ? undefined : (finished ?? now) - started;
  return { queued, running };
}
const spanOr = (v: number | undefined) =>
  v === undefined ? h("span", { class: "muted" }, "—") : span(v);

/** The Queued and Running cells of a task's row. */
function durationCells(t: Task) {
  const { queued, running } = durations(t);
  return [h("td", { class: "num" }, spanOr(queued)), h("td", { class: "num" }, spanOr(running))];
}

const pageSize = 50;

function progress(t: Task) {
  const done = t.progress?.completedSteps ?? 0;
  const message = t.progress?.message ?? "";
  if (!done && !message) return h("span", { class: "muted" }, "—");
  const text = t.steps ? `${done}/${t.steps}` : String(done);
  return h("span", { title: message }, text, message ? ` · ${message}` : "");
}

/** Tasks: filters (state, workload, correlation id, worker) in the URL's hash, pages of 50, refreshed every 3 s. */
export function tasksPage(page: Page): void {
  page.title("Tasks");
  const p = page.params;
  const stateName = (p.get("state") ?? "").toUpperCase();
  const filter = {
    state:
      (TaskState[stateName as keyof typeof TaskState] as TaskState | undefined) ??
      TaskState.UNSPECIFIED,
    workload: p.get("workload") ?? "",
    correlationId: p.get("correlation") ?? "",
    workerId: p.get("worker") ?? "",
  };
  const state = h(
    "select",
    { name: "state", "aria-label": "State" },
    h("option", { value: "" }, "Any state"),
    ...taskStates.map((st) =>
      h("option", { value: taskStateName(st), selected: st === filter.state }, taskStateName(st)),
    ),
  );
  const input = (name: string, placeholder: string, value: string) =>
    h("input", {
      name,
      placeholder,
      value,
      "aria-label": placeholder,
      autocomplete: "off",
      spellcheck: "false",
    });
  const workload = input("workload", "Workload", filter.workload);
  const correlation = input("correlation", "Correlation id", filter.correlationId);
  const worker = input("worker", "Worker id", filter.workerId);
  const search = h("input", {
    name: "q",
    type: "search",
    placeholder: "Task id or name",
    value: p.get("q") ?? "",
    "aria-label": "Search by task id or name",
    autocomplete: "off",
    spellcheck: "false",
  });
  const query = (p.get("q") ?? "").trim().toLowerCase();
  const form = h(
    "form",
    { class: "filters" },
    search,
    state,
    workload,
    correlation,
    worker,
    h("button", { class: "btn", type: "submit" }, "Filter"),
    h("a", { class: "btn ghost", href: "#/tasks" }, "Clear"),
  );
  const apply = () => {
    // A task id goes straight to its page.
    if (uuid.test(search.value.trim())) {
      location.hash = `#/tasks/${search.value.trim()}`;
      return;
    }
    const q = new URLSearchParams();
    if (search.value.trim()) q.set("q", search.value.trim());
    if (state.value) q.set("state", state.value);
    if (workload.value.trim()) q.set("workload", workload.value.trim());
    if (correlation.value.trim()) q.set("correlation", correlation.value.trim());
    if (worker.value.trim()) q.set("worker", worker.value.trim());
    const query = q.toString();
    location.hash = `#/tasks${query ? `?${query}` : ""}`;
  };
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    apply();
  });
  state.addEventListener("change", apply);

  const body = h("div", { class: "panel scroll" });
  const pager = createPager(page, { previous: "← Newer", next: "Older →" }, () => load());
  // Bulk actions on the ticked tasks (RerunTasks, CancelTasks with their ids).
  const selected = new Set<string>();
  const bulkInfo = h("span", { class: "muted", id: "selected-count" });
  const rerunSelected = h(
    "button",
    { class: "btn", type: "button", id: "rerun-selected" },
    "Run selected again",
  );
  const cancelSelected = h(
    "button",
    { class: "btn danger", type: "button", id: "cancel-selected" },
    "Cancel selected",
  );
  const bulk = h("div", { class: "bulk", hidden: true }, bulkInfo, rerunSelected, cancelSelected);
  const showSelection = () => {
    bulkInfo.textContent = `${selected.size} selected`;
    rerunSelected.disabled = cancelSelected.disabled = selected.size === 0;
  };
  const runBulk = (button: HTMLButtonElement, verb: "rerun" | "cancel") => {
    const ids = [...selected];
    if (!confirm(`${verb === "rerun" ? "Run again" : "Cancel"} ${ids.length} task(s)?`)) return;
    void act(button, page, async () => {
      const filter = { taskIds: ids };
      const r =
        verb === "rerun"
          ? await tasks.rerunTasks({ filter })
          : await tasks.cancelTasks({ filter, reason: "canceled from the dashboard" });
      bulkInfo.textContent = `${verb === "rerun" ? "reran" : "cancelled"} ${r.count} of ${ids.length}`;
      selected.clear();
      await load();
    });
  };
  rerunSelected.addEventListener("click", () => runBulk(rerunSelected, "rerun"));
  cancelSelected.addEventListener("click", () => runBulk(cancelSelected, "cancel"));
  let manage = false;
  void whatMayI().then((a) => {
    manage = a.manageTasks;
    bulk.hidden = !manage;
    showSelection();
  });
  fill(page.el, h("h1", null, "Tasks"), form, bulk, body, pager.el);

  const load = async () => {
    const [r, workers] = await Promise.all([
      tasks.listTasks({ ...filter, pageSize, pageToken: pager.token }, { signal: page.signal }),
      fleet.listWorkers({ pageSize: 1000 }, { signal: page.signal }).catch(() => ({ workers: [] })),
    ]);
    const names = new Map(workers.workers.map((w) => [w.workerId, w.name || w.peerId]));
    // The search narrows the page read by name or id (a whole id opens the task).
    const shown = query
      ? r.tasks.filter((t) => t.name.toLowerCase().includes(query) || t.taskId.startsWith(query))
      : r.tasks;
    pager.shown(r.nextPageToken, `${shown.length} task${shown.length === 1 ? "" : "s"}`);
    const filtered =
      query || filter.state || filter.workload || filter.correlationId || filter.workerId;
    const tick = (t: Task) => {
      const box = h("input", {
        type: "checkbox",
        "aria-label": `Select task ${t.name || t.taskId}`,
        "data-select": t.taskId,
        checked: selected.has(t.taskId),
      });
      box.addEventListener("change", () => {
        if (box.checked) selected.add(t.taskId);
        else selected.delete(t.taskId);
        showSelection();
      });
      return box;
    };
    const workerOf = (t: Task) => {
      const id = t.lease?.workerId || t.assignedWorkerId;
      if (!id) return h("span", { class: "muted" }, "—");
      const name = names.get(id);
      return name ? h("span", { title: id }, name) : shortId(id);
    };
    fill(
      body,
      shown.length
        ? h(
            "table",
            { class: "grid-table", id: "tasks" },
            h(
              "thead",
              null,
              h(
                "tr",
                null,
                manage && h("th", null, h("span", { class: "sr-only" }, "Select")),
                h("th", null, "Task"),
                h("th", null, "Name"),
                h("th", null, "Workload"),
                h("th", null, "State"),
                h("th", { class: "num" }, "Attempt"),
                h("th", null, "Worker"),
                h("th", null, "Progress"),
                h("th", { class: "num" }, "Queued"),
                h("th", { class: "num" }, "Running"),
                h("th", null, "Created"),
                h("th", null, "Updated"),
              ),
            ),
            h(
              "tbody",
              null,
              ...shown.map((t) =>
                h(
                  "tr",
                  { "data-task-row": t.taskId },
                  manage && h("td", null, tick(t)),
                  h("td", null, h("a", { href: `#/tasks/${t.taskId}` }, shortId(t.taskId))),
                  h("td", null, h("a", { href: `#/tasks/${t.taskId}` }, t.name || "(unnamed)")),
                  h("td", null, t.workload || h("span", { class: "muted" }, "—")),
                  h(
                    "td",
                    null,
                    statePill(t.state),
                    t.cancelRequested &&
                      !terminal.has(t.state) &&
                      h("span", { class: "pill drained" }, "CANCEL REQUESTED"),
                  ),
                  h("td", { class: "num" }, `${t.attempt} / ${t.maxAttempts}`),
                  h("td", { "data-worker-cell": "" }, workerOf(t)),
                  h("td", null, progress(t)),
                  ...durationCells(t),
                  h("td", null, when(t.createdAt)),
                  h("td", null, when(t.updatedAt)),
                ),
              ),
            ),
          )
        : filtered
          ? empty(
              "No task matches these filters.",
              "Clear a filter, or wait: this list refreshes every 3 s.",
            )
          : empty(
              "No tasks yet.",
              "Create one with ",
              h("code", null, "npx meshwork task create --workload <name>"),
              " or TaskService.CreateTask (README, Quick start); it appears here within 3 s.",
            ),
    );
  };
  page.every(refreshMs, load);
}
