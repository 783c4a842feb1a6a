import { type Task, TaskState } from "../../../gen/meshwork/v1/task_pb.js";
import { tasks } from "../api.js";
import { fill, h } from "../dom.js";
import { shortId, statePill, taskStateName, taskStates, terminal, when } from "../format.js";
import { createPager, empty, type Page, refreshMs } from "../page.js";

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
  const form = h(
    "form",
    { class: "filters" },
    state,
    workload,
    correlation,
    worker,
    h("button", { class: "btn", type: "submit" }, "Filter"),
    h("a", { class: "btn ghost", href: "#/tasks" }, "Clear"),
  );
  const apply = () => {
    const q = new URLSearchParams();
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

  const body = h("div", { class: "panel" });
  const pager = createPager(page, { previous: "← Newer", next: "Older →" }, () => load());
  fill(page.el, h("h1", null, "Tasks"), form, body, pager.el);

  const load = async () => {
    const r = await tasks.listTasks(
      { ...filter, pageSize, pageToken: pager.token },
      { signal: page.signal },
    );
    pager.shown(r.nextPageToken, `${r.tasks.length} task${r.tasks.length === 1 ? "" : "s"}`);
    const filtered = filter.state || filter.workload || filter.correlationId || filter.workerId;
    fill(
      body,
      r.tasks.length
        ? h(
            "table",
            { class: "grid-table", id: "tasks" },
            h(
              "thead",
              null,
              h(
                "tr",
                null,
                h("th", null, "Task"),
                h("th", null, "Name"),
                h("th", null, "Workload"),
                h("th", null, "State"),
                h("th", { class: "num" }, "Attempt"),
                h("th", null, "Worker"),
                h("th", null, "Progress"),
                h("th", null, "Created"),
                h("th", null, "Updated"),
              ),
            ),
            h(
              "tbody",
              null,
              ...r.tasks.map((t) =>
                h(
                  "tr",
                  { "data-task-row": t.taskId },
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
                  h(
                    "td",
                    null,
                    t.lease?.workerId || t.assignedWorkerId
                      ? shortId(t.lease?.workerId || t.assignedWorkerId)
                      : h("span", { class: "muted" }, "—"),
                  ),
                  h("td", null, progress(t)),
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
