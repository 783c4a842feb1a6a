import { type Worker, WorkerState } from "../../../gen/meshwork/v1/fleet_pb.js";
import { type Task, TaskState } from "../../../gen/meshwork/v1/task_pb.js";
import { type Abilities, fleet, shares, tasks, whatMayI } from "../api.js";
import { chart, onSample, record } from "../chart.js";
import { fill, h } from "../dom.js";
import {
  durationMs,
  meter,
  span,
  statePill,
  taskStateName,
  taskStates,
  when,
  workerPill,
} from "../format.js";
import { act, empty, type Page, refreshMs } from "../page.js";
import { resourceUse, sharesTable, workersNeeded } from "./scheduling.js";

/** Running and assigned tasks per workload (up to 1000 of each: enough for a glance). */
async function activeByWorkload(signal: AbortSignal): Promise<Map<string, number>> {
  const counts = new Map<string, number>();
  for (const state of [TaskState.RUNNING, TaskState.ASSIGNED]) {
    const { tasks: list } = await tasks.listTasks({ state, pageSize: 1000 }, { signal });
    for (const t of list as Task[]) counts.set(t.workload, (counts.get(t.workload) ?? 0) + 1);
  }
  return counts;
}

/** Every worker, page after page. */
async function allWorkers(signal: AbortSignal): Promise<Worker[]> {
  const all: Worker[] = [];
  let pageToken = "";
  do {
    const r = await fleet.listWorkers({ pageSize: 1000, pageToken }, { signal });
    all.push(...r.workers);
    pageToken = r.nextPageToken;
  } while (pageToken);
  return all;
}

function chips(values: string[], cls = "chip") {
  return values.length
    ? h("span", { class: "chips" }, ...values.map((v) => h("span", { class: cls }, v)))
    : h("span", { class: "muted" }, "—");
}

function workerRow(w: Worker, page: Page, reload: () => Promise<void>, may: Abilities) {
  const load = w.maxConcurrency > 0 ? Math.min(1, w.activeLeases / w.maxConcurrency) : 0;
  const button = h(
    "button",
    { class: w.drained ? "btn" : "btn warn", type: "button", "data-worker": w.workerId },
    w.drained ? "Undrain" : "Drain",
  );
  button.addEventListener("click", () => {
    const what = w.drained
      ? `Undrain ${w.name || w.workerId}? It will claim new tasks again.`
      : `Drain ${w.name || w.workerId}? It finishes its leases but claims no new tasks.`;
    if (!confirm(what)) return;
    void act(button, page, async () => {
      await fleet.drainWorker({ workerId: w.workerId, drained: !w.drained });
      await reload();
    });
  });
  return h(
    "tr",
    { "data-worker-row": w.workerId },
    h(
      "td",
      null,
      h("div", { class: "strong" }, w.name || "(unnamed)"),
      h("code", { class: "sub" }, w.workerId),
    ),
    h(
      "td",
      null,
      workerPill(w.state),
      w.drained && h("span", { class: "pill drained" }, "DRAINED"),
    ),
    h("td", null, chips(w.capabilities)),
    h(
      "td",
      null,
      chips(
        Object.entries(w.labels).map(([k, v]) => `${k}=${v}`),
        "chip label",
      ),
    ),
    h("td", { class: "num" }, w.queueDepth),
    h(
      "td",
      { class: "num" },
      h("span", null, `${w.activeLeases} / ${w.maxConcurrency}`),
      meter(load),
    ),
    h("td", null, resourceUse(w)),
    h("td", null, when(w.lastHeartbeatAt)),
    // Drain is an admin's (or the worker's own token's) call; a LOST worker
    // claims nothing anyway: it is removed with "Remove LOST workers".
    h("td", { class: "actions" }, may.manageWorkers && w.state !== WorkerState.LOST && button),
  );
}

/** Fleet: task counts, the chart, the backlog per workload and the workers. */
export function fleetPage(page: Page): void {
  page.title("Fleet");
  const counts = h("div", { class: "counts" });
  const chartBox = h("div", null, chart());
  const backlog = h("section", { class: "panel" });
  const workers = h("section", { class: "panel" });
  const shareTree = h("section", { class: "panel" });
  fill(page.el, h("h1", null, "Fleet"), counts, chartBox, backlog, workers, shareTree);
  onSample(() => fill(chartBox, chart()), page.signal);

  const prune = h(
    "button",
    { class: "btn", type: "button", id: "prune-lost" },
    "Remove LOST workers",
  );
  prune.addEventListener("click", () => {
    if (!confirm("Remove every LOST worker that holds no lease? Their tasks keep their history."))
      return;
    void act(prune, page, async () => {
      // The shortest the coordinator allows: LOST now (3 missed heartbeats).
      await fleet.pruneWorkers({ lostFor: { seconds: 1n, nanos: 0 } });
      await reload();
    });
  });
  const reload = async () => {
    const [status, list, active, may, tree] = await Promise.all([
      fleet.getFleetStatus({}, { signal: page.signal }),
      allWorkers(page.signal),
      activeByWorkload(page.signal),
      whatMayI(),
      shares.listShares({ pageSize: 1000 }, { signal: page.signal }),
    ]);
    fill(
      shareTree,
      h("h2", null, "Shares"),
      h(
        "p",
        { class: "muted" },
        `Entitled: the part of the fleet a share gets while it has work; holds now: what its leases hold; usage: the same, decayed with a half-life of ${tree.halfLifeSeconds} s.`,
      ),
      sharesTable(tree.shares),
      tree.nextPageToken
        ? h("p", { class: "muted" }, "The first 1,000 nodes: meshwork share list prints them all.")
        : null,
    );
    // The chart's legend shows this same read.
    record(status);
    const byState = new Map(status.taskCounts.map((c) => [c.state, Number(c.count)]));
    fill(
      counts,
      ...taskStates.map((st) =>
        h(
          "a",
          {
            class: `count state-${taskStateName(st).toLowerCase()}`,
            href: `#/tasks?state=${taskStateName(st)}`,
          },
          h("span", { class: "count-n" }, byState.get(st) ?? 0),
          statePill(st),
        ),
      ),
    );

    const workloads = new Set([...status.backlog.map((b) => b.workload), ...active.keys()]);
    const rows = [...workloads].sort().map((name) => {
      const b = status.backlog.find((x) => x.workload === name);
      return h(
        "tr",
        null,
        h(
          "td",
          null,
          h("a", { href: `#/tasks?workload=${encodeURIComponent(name)}` }, name || "(none)"),
        ),
        h("td", { class: "num" }, Number(b?.pendingCount ?? 0)),
        h("td", { class: "num" }, active.get(name) ?? 0),
        h(
          "td",
          null,
          b?.oldestAge ? span(durationMs(b.oldestAge)) : h("span", { class: "muted" }, "—"),
        ),
        h("td", null, b ? workersNeeded(b) : h("span", { class: "muted" }, "—")),
      );
    });
    fill(
      backlog,
      h("h2", null, "Backlog per workload"),
      rows.length
        ? h(
            "table",
            { class: "grid-table" },
            h(
              "thead",
              null,
              h(
                "tr",
                null,
                h("th", null, "Workload"),
                h("th", { class: "num" }, "Pending"),
                h("th", { class: "num" }, "Running"),
                h("th", null, "Oldest pending"),
                h("th", null, "Workers needed"),
              ),
            ),
            h("tbody", null, ...rows),
          )
        : empty(
            "Nothing waiting or running.",
            "Create a task with ",
            h("code", null, "npx meshwork task create --workload <name>"),
            " or TaskService.CreateTask; it shows up here until a worker finishes it.",
          ),
    );

    fill(
      workers,
      h(
        "div",
        { class: "panel-head" },
        h("h2", null, `Workers (${list.length})`),
        may.manageWorkers && list.some((w) => w.state === WorkerState.LOST) && prune,
      ),
      list.length
        ? h(
            "table",
            { class: "grid-table", id: "workers" },
            h(
              "thead",
              null,
              h(
                "tr",
                null,
                h("th", null, "Worker"),
                h("th", null, "State"),
                h("th", null, "Capabilities"),
                h("th", null, "Labels"),
                h("th", { class: "num" }, "Queue"),
                h("th", { class: "num" }, "Leases / max"),
                h("th", null, "Resources used"),
                h("th", null, "Last heartbeat"),
                h("th", null, ""),
              ),
            ),
            h("tbody", null, ...list.map((w) => workerRow(w, page, reload, may))),
          )
        : empty(
            "No workers yet.",
            "Start one with ",
            h(
              "code",
              null,
              `MESHWORK_TOKEN=<worker token> npx meshwork work --url ${location.origin} --workload <name> -- <command>`,
            ),
            " (a worker token, kept out of the process list: ",
            h("code", null, "npx meshwork token create --role worker --name <name>"),
            ").",
          ),
    );
  };
  page.every(refreshMs, reload);
}
