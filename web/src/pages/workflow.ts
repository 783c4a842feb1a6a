import { Code, ConnectError } from "@connectrpc/connect";
import type { Task } from "../../../gen/meshwork/v1/task_pb.js";
import { fill, h, s } from "../dom.js";
import { taskStateName, taskStates, terminal } from "../format.js";
import { empty, notFound, type Page, refreshMs } from "../page.js";
import { findGraph, type Graph, layout, maxListed, maxNodes } from "../workflow-graph.js";

const nodeW = 176;
const nodeH = 46;
const colGap = 72;
const rowGap = 18;
const pad = 12;

/** What a node says: its ref, else its name, else the start of its id. */
export function labelOf(t: Task): string {
  return t.ref || t.name || t.taskId.slice(0, 8);
}

/** Cuts `text` to `n` characters with an ellipsis. */
function clip(text: string, n: number): string {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

/**
 * The graph as SVG: one column per layer (longest path from a root), a
 * node per task coloured by its state (the pills' colours) and linking to
 * its task page, an arrow from each dependency to its dependent: solid
 * once the dependency finished, dashed while it has not.
 */
function drawGraph(graph: Graph, current: string): SVGElement {
  const { placed, layers } = layout(graph.nodes);
  const perLayer = Array.from({ length: layers }, () => 0);
  for (const p of placed.values()) perLayer[p.layer] = (perLayer[p.layer] ?? 0) + 1;
  const tallest = Math.max(1, ...perLayer);
  const width = pad * 2 + layers * nodeW + (layers - 1) * colGap;
  const height = pad * 2 + tallest * nodeH + (tallest - 1) * rowGap;
  const at = (id: string) => {
    const p = placed.get(id);
    if (!p) return undefined;
    // Each layer is centred on the tallest one.
    const offset = ((tallest - (perLayer[p.layer] ?? 0)) * (nodeH + rowGap)) / 2;
    return { x: pad + p.layer * (nodeW + colGap), y: pad + offset + p.row * (nodeH + rowGap) };
  };
  const arrow = s(
    "marker",
    {
      id: "wf-arrow",
      class: "wf-arrow",
      viewBox: "0 0 10 10",
      refX: 9,
      refY: 5,
      markerWidth: 7,
      markerHeight: 7,
      orient: "auto",
    },
    s("path", { d: "M0,0 L10,5 L0,10 z" }),
  );
  const edges: SVGElement[] = [];
  for (const t of graph.nodes.values()) {
    const to = at(t.taskId);
    for (const d of t.dependsOn) {
      const from = at(d);
      const dep = graph.nodes.get(d);
      if (!from || !to || !dep) continue;
      const x1 = from.x + nodeW;
      const y1 = from.y + nodeH / 2;
      const x2 = to.x - 2;
      const y2 = to.y + nodeH / 2;
      const bend = Math.max(24, (x2 - x1) / 2);
      edges.push(
        s(
          "path",
          {
            class: `wf-edge${terminal.has(dep.state) ? "" : " wf-open"}`,
            d: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`,
            "marker-end": "url(#wf-arrow)",
            "data-edge": `${d}>${t.taskId}`,
          },
          s("title", {}, document.createTextNode(`${labelOf(dep)} → ${labelOf(t)}`)),
        ),
      );
    }
  }
  const nodes = [...placed.values()].map(({ task: t }) => {
    const { x, y } = at(t.taskId) ?? { x: 0, y: 0 };
    const state = taskStateName(t.state);
    const detail =
      t.dependenciesPending > 0 && !terminal.has(t.state)
        ? `${state} · waits for ${t.dependenciesPending}`
        : state;
    const text = (cls: string, dy: number, value: string) =>
      s("text", { class: cls, x: x + 10, y: y + dy }, document.createTextNode(value));
    return s(
      "a",
      {
        href: `#/tasks/${encodeURIComponent(t.taskId)}`,
        class: `wf-node state-${state.toLowerCase()}${t.taskId === current ? " current" : ""}`,
        "data-node": t.taskId,
        "data-state": state,
        "data-label": labelOf(t),
      },
      s(
        "title",
        {},
        document.createTextNode(`${labelOf(t)} (${t.name || "unnamed"}) · ${state} · ${t.taskId}`),
      ),
      s("rect", { x, y, width: nodeW, height: nodeH, rx: 7 }),
      text("wf-label", 19, clip(labelOf(t), 22)),
      text("wf-detail", 36, clip(detail, 28)),
    );
  });
  return s(
    "svg",
    {
      class: "wf-graph",
      id: "workflow-graph",
      width,
      height,
      viewBox: `0 0 ${width} ${height}`,
      role: "img",
      "aria-label": `Workflow graph of ${graph.nodes.size} tasks`,
    },
    s("defs", {}, arrow),
    ...edges,
    ...nodes,
  );
}

/** The legend: each state's colour with how many tasks of the graph are in it. */
function legend(graph: Graph) {
  const counts = new Map<number, number>();
  for (const t of graph.nodes.values()) counts.set(t.state, (counts.get(t.state) ?? 0) + 1);
  return h(
    "ul",
    { class: "wf-legend", id: "workflow-counts" },
    ...taskStates.map((st) => {
      const name = taskStateName(st);
      return h(
        "li",
        { "data-count-state": name, class: counts.get(st) ? undefined : "muted" },
        h("span", { class: `wf-swatch state-${name.toLowerCase()}` }),
        `${name} `,
        h("strong", null, String(counts.get(st) ?? 0)),
      );
    }),
    h("li", { class: "muted" }, h("span", { class: "wf-swatch current" }), "this task"),
    h("li", { class: "muted" }, h("span", { class: "wf-line" }), "finished dependency"),
    h("li", { class: "muted" }, h("span", { class: "wf-line open" }), "not finished"),
  );
}

/**
 * A task's workflow: the graph of tasks it belongs to (workflow-graph.ts
 * says how it is found and bounded), drawn as SVG, read again every 3 s
 * while any of its tasks is not finished.
 */
export function workflowPage(page: Page, taskId: string): void {
  page.title(`Workflow ${taskId.slice(0, 8)}`);
  const heading = h("h1", null, "Workflow");
  const live = h("span", { class: "live" }, "loading…");
  const summary = h("p", { class: "muted", id: "workflow-summary" });
  const cut = h("p", { class: "wf-cut", id: "workflow-cut", role: "status", hidden: true });
  const counts = h("div");
  const body = h("div", { class: "panel wf-panel" });
  fill(
    page.el,
    h(
      "p",
      { class: "crumbs" },
      h("a", { href: "#/tasks" }, "Tasks"),
      " / ",
      h("a", { href: `#/tasks/${encodeURIComponent(taskId)}` }, h("code", null, taskId)),
      " / Workflow",
    ),
    heading,
    summary,
    cut,
    counts,
    body,
    h(
      "p",
      { class: "muted" },
      `Found by walking depends_on up from this task and listing the tasks of its correlation id (one CreateTasks call) for its dependents; at most ${maxNodes.toLocaleString("en")} tasks are drawn and ${maxListed.toLocaleString("en")} read. Dependents created by later calls are not shown.`,
    ),
  );

  let drawn = "";
  let finished = false;
  page.every(refreshMs, async () => {
    if (finished) return;
    let graph: Graph;
    try {
      graph = await findGraph(taskId, page.signal);
    } catch (e) {
      const code = ConnectError.from(e).code;
      if (!drawn && (code === Code.NotFound || code === Code.InvalidArgument)) {
        finished = true;
        notFound(page, `There is no task ${JSON.stringify(taskId.slice(0, 64))}.`);
        return;
      }
      throw e;
    }
    const self = graph.nodes.get(taskId);
    if (self) {
      page.title(`Workflow of ${labelOf(self)}`);
      fill(heading, "Workflow of ", labelOf(self), " ", live);
    }
    finished = [...graph.nodes.values()].every((t) => terminal.has(t.state));
    live.textContent = finished ? "finished" : "● live";
    live.className = finished ? "live" : "live on";
    const edges = [...graph.nodes.values()].reduce(
      (n, t) => n + t.dependsOn.filter((d) => graph.nodes.has(d)).length,
      0,
    );
    summary.textContent = `${graph.nodes.size} task${graph.nodes.size === 1 ? "" : "s"}, ${edges} dependenc${edges === 1 ? "y" : "ies"}${graph.missing.size ? `; ${graph.missing.size} dependenc${graph.missing.size === 1 ? "y" : "ies"} could not be read` : ""}.`;
    cut.hidden = graph.cut === "";
    cut.textContent = graph.cut ? `Not the whole graph: ${graph.cut}.` : "";
    // Redrawn only when a task changed, so a focused node keeps its focus.
    const key = [...graph.nodes.values()]
      .map((t) => `${t.taskId}:${t.state}:${t.dependenciesPending}`)
      .join(",");
    if (key === drawn) return;
    drawn = key;
    fill(counts, legend(graph));
    fill(
      body,
      graph.nodes.size > 1
        ? drawGraph(graph, taskId)
        : [
            drawGraph(graph, taskId),
            empty(
              "This task has no dependencies and no dependents.",
              'A graph is created in one CreateTasks call: give tasks a ref and depends_on ["ref:NAME"] (docs/workflows.md).',
            ),
          ],
    );
  });
}
