import type { Worker, WorkloadBacklog } from "../../../gen/meshwork/v1/fleet_pb.js";
import type { Share } from "../../../gen/meshwork/v1/share_pb.js";
import {
  type LabelRequirement,
  Operator,
  type Task,
  WaitKind,
  type WaitReason,
} from "../../../gen/meshwork/v1/task_pb.js";
import { h } from "../dom.js";
import { meter } from "../format.js";
import { empty } from "../page.js";

// The dashboard's scheduling views (docs/scheduling.md): a worker's
// resources, the share tree, a task's resources and selectors, and why a
// PENDING task waits.

const pct = (f: number) => `${(f * 100).toFixed(1)}%`;

/** A map's entries by name, slots first. */
const entries = (m: Record<string, bigint>) =>
  Object.entries(m).sort(([a], [b]) => (a === "slots" ? -1 : b === "slots" ? 1 : a < b ? -1 : 1));

/** A worker's use of each resource it offers: "gpu 1 / 2" with a bar; slots are the leases column. */
export function resourceUse(w: Pick<Worker, "capacity" | "allocated">) {
  const rows = entries(w.capacity).filter(([name]) => name !== "slots");
  if (rows.length === 0) return h("span", { class: "muted" }, "slots only");
  return h(
    "div",
    { class: "resources" },
    ...rows.map(([name, cap]) => {
      const used = w.allocated[name] ?? 0n;
      return h(
        "div",
        { class: "resource", "data-resource": name },
        h("span", null, `${name} ${used} / ${cap}`),
        meter(cap > 0n ? Number(used) / Number(cap) : 0),
      );
    }),
  );
}

/** A backlog row's demand: "3 × gpu=4,cpu=16000". */
export function workersNeeded(b: WorkloadBacklog) {
  const shape = entries(b.workerCapacity)
    .map(([k, v]) => `${k}=${v}`)
    .join(",");
  return h(
    "span",
    { title: `workers of ${shape || "one slot"}` },
    `${b.workersNeeded} × ${shape || "slot"}`,
  );
}

/** The share tree: each node's weight, entitlement, usage, allocation and tasks. */
export function sharesTable(list: Share[]) {
  if (list.length === 0) {
    return empty(
      "No shares yet.",
      "Every task is charged to a share (its token's name by default); weights are set with ",
      h("code", null, "npx meshwork share set lab/team-a 2"),
      ".",
    );
  }
  return h(
    "table",
    { class: "grid-table", id: "shares" },
    h(
      "thead",
      null,
      h(
        "tr",
        null,
        h("th", null, "Share"),
        h("th", { class: "num" }, "Weight"),
        h("th", null, "Entitled"),
        h("th", null, "Holds now"),
        h("th", { class: "num" }, "Usage"),
        h("th", { class: "num" }, "Running"),
        h("th", { class: "num" }, "Pending"),
      ),
    ),
    h(
      "tbody",
      null,
      ...list.map((s) =>
        h(
          "tr",
          { "data-share": s.path },
          h(
            "td",
            { class: `depth-${Math.min(7, s.path.split("/").length - 1)}` },
            h("code", null, s.path),
          ),
          h("td", { class: "num" }, s.weight),
          h("td", null, h("span", null, pct(s.entitlement)), meter(s.entitlement)),
          h("td", null, h("span", null, pct(s.allocation)), meter(s.allocation)),
          h("td", { class: "num" }, pct(s.usage)),
          h("td", { class: "num" }, Number(s.running)),
          h("td", { class: "num" }, Number(s.pending)),
        ),
      ),
    ),
  );
}

const operatorText: Record<Operator, (r: LabelRequirement) => string> = {
  [Operator.UNSPECIFIED]: (r) => r.key,
  [Operator.IN]: (r) => `${r.key} in (${r.values.join(", ")})`,
  [Operator.NOT_IN]: (r) => `${r.key} not in (${r.values.join(", ")})`,
  [Operator.EXISTS]: (r) => `has ${r.key}`,
  [Operator.DOES_NOT_EXIST]: (r) => `no ${r.key}`,
  [Operator.GT]: (r) => `${r.key} > ${r.values[0] ?? ""}`,
  [Operator.LT]: (r) => `${r.key} < ${r.values[0] ?? ""}`,
};

/** A task's scheduling fields, as [label, text] rows. */
export function schedulingRows(t: Task): [string, string][] {
  const rows: [string, string][] = [
    [
      "Resources",
      entries(t.resources)
        .map(([k, v]) => `${k} ${v}`)
        .join(", "),
    ],
    ["Share", t.share],
  ];
  if (t.requirements.length > 0) {
    rows.push(["Requires", t.requirements.map((r) => operatorText[r.operator](r)).join("; ")]);
  }
  if (t.preferences.length > 0) {
    rows.push([
      "Prefers",
      t.preferences
        .map(
          (p) =>
            `${p.weight}: ${p.requirement ? operatorText[p.requirement.operator](p.requirement) : ""}`,
        )
        .join("; "),
    ]);
  }
  if (t.concurrencyKey) rows.push(["Concurrency key", t.concurrencyKey]);
  if (t.rateKey) rows.push(["Rate key", t.rateKey]);
  return rows;
}

/** Why a PENDING task waits: each reason, and its place in its share's queue. */
export function waitingList(waiting: WaitReason[], queuePosition: number) {
  return h(
    "div",
    { id: "waiting" },
    h("p", null, `Position ${queuePosition} in its share's queue.`),
    waiting.length === 0
      ? h(
          "p",
          { class: "muted" },
          "Nothing holds it back: the next claim of a fitting worker takes it.",
        )
      : h(
          "ul",
          { class: "reasons" },
          ...waiting.map((w) =>
            h(
              "li",
              { "data-kind": WaitKind[w.kind] ?? "" },
              h("strong", null, (WaitKind[w.kind] ?? "").toLowerCase().replace(/_/g, " ")),
              ": ",
              w.message,
            ),
          ),
        ),
  );
}
