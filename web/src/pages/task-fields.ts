import { type Artifact, ArtifactKind } from "../../../gen/meshwork/v1/artifact_pb.js";
import { DeliveryState, DependencyPolicy, type Task } from "../../../gen/meshwork/v1/task_pb.js";
import { download } from "../api.js";
import { type Child, h } from "../dom.js";
import { bytes, exact, shortId, span, when } from "../format.js";
import { act, empty, type Page } from "../page.js";

// The task page's fields and artifact table (task.ts lays them out).

/** A field: its label and value, "—" when the value is empty (undefined, false, ""). */
export function row(label: string, ...value: Child[]) {
  const shown = value.filter((v) => v !== undefined && v !== null && v !== false && v !== "");
  return [
    h("dt", null, label),
    h("dd", null, ...(shown.length ? shown : [h("span", { class: "muted" }, "—")])),
  ];
}

export function or(value: string | number | undefined) {
  return value === undefined || value === "" ? undefined : String(value);
}

/** JSON longer than this many lines (or characters) starts collapsed. */
const longLines = 12;
const longChars = 800;

/** A JSON value, pretty; a long one collapsed behind a summary saying its size. */
export function jsonValue(value: unknown, id?: string) {
  const text = JSON.stringify(value, null, 2);
  const lines = text.split("\n").length;
  if (lines <= longLines && text.length <= longChars) return h("pre", { id }, text);
  return h(
    "details",
    { class: "json-value", id },
    h("summary", null, `${lines} lines, ${bytes(new TextEncoder().encode(text).length)}`),
    h("pre", null, text),
  );
}

/** A link that downloads an artifact with the token (a plain link cannot send it). */
function artifactLink(artifactId: string, filename: string, page: Page) {
  const a = h(
    "a",
    { href: `/artifacts/${encodeURIComponent(artifactId)}/download`, title: artifactId },
    h("code", null, artifactId.slice(0, 8)),
  );
  a.addEventListener("click", (e) => {
    e.preventDefault();
    download(artifactId, filename).catch((err: unknown) => page.error(err, "action"));
  });
  return a;
}

/**
 * The workflow fields of a task: its ref, dependencies (links) and how many
 * are pending, the policy, the dependencies' outputs (each a download), its
 * run_at, timeout and the schedule that made it.
 */
export function workflowRows(t: Task, page: Page) {
  const deps = t.dependsOn.length > 0;
  const outputs = Object.entries(t.dependencyOutputs).sort(([a], [b]) => a.localeCompare(b));
  return [
    row("Ref", t.ref && h("code", null, t.ref)),
    row(
      "Depends on",
      deps &&
        h(
          "span",
          { class: "chips", id: "depends-on" },
          ...t.dependsOn.map((d) =>
            h("a", { href: `#/tasks/${encodeURIComponent(d)}`, "data-dependency": d }, shortId(d)),
          ),
        ),
    ),
    deps &&
      row(
        "Dependencies pending",
        h(
          "span",
          { id: "dependencies-pending" },
          `${t.dependenciesPending} of ${t.dependsOn.length}`,
        ),
      ),
    deps &&
      row(
        "Dependency policy",
        t.dependencyPolicy === DependencyPolicy.ALL_DONE
          ? "ALL_DONE (runs once every dependency finished, whichever way)"
          : "ALL_SUCCEEDED (runs once every dependency succeeded)",
      ),
    deps &&
      row(
        "Dependency outputs",
        outputs.length > 0 &&
          h(
            "ul",
            { class: "dep-outputs", id: "dependency-outputs" },
            ...outputs.map(([name, artifactId]) =>
              h(
                "li",
                { "data-output": name },
                h("code", null, name),
                "→",
                artifactLink(artifactId, name.slice(name.lastIndexOf("/") + 1), page),
              ),
            ),
          ),
      ),
    row("Run at", t.runAt && exact(t.runAt)),
    row("Timeout", t.timeoutSeconds > 0 && `${span(t.timeoutSeconds * 1000)} per attempt`),
    row("Delivery", t.dispatch && h("span", { id: "delivery" }, deliveryText(t))),
    row(
      "Schedule",
      t.scheduleId &&
        h(
          "a",
          { href: `#/schedules?schedule=${encodeURIComponent(t.scheduleId)}`, id: "schedule-link" },
          shortId(t.scheduleId),
        ),
    ),
  ];
}

/** The result value a completion carried, as JSON. */
export function resultValueRow(t: Task) {
  return row("Result value", t.resultValue && jsonValue(t.resultValue, "result-value"));
}

export function artifactTable(list: Artifact[], page: Page) {
  if (!list.length) {
    return empty(
      "No artifacts.",
      "A worker uploads them with ArtifactService.UploadArtifact or PUT /tasks/<id>/artifacts/<name> while it holds the lease.",
    );
  }
  return h(
    "table",
    { class: "grid-table", id: "artifacts" },
    h(
      "thead",
      null,
      h(
        "tr",
        null,
        h("th", null, "File"),
        h("th", null, "Kind"),
        h("th", { class: "num" }, "Size"),
        h("th", null, "Type"),
        h("th", null, "SHA-256"),
        h("th", null, "Attempt"),
        h("th", null, "Created"),
        h("th", null, ""),
      ),
    ),
    h(
      "tbody",
      null,
      ...list.map((a) => {
        const button = h("button", { class: "btn", type: "button" }, "Download");
        button.addEventListener(
          "click",
          () => void act(button, page, () => download(a.artifactId, a.filename)),
        );
        return h(
          "tr",
          null,
          h("td", null, a.filename || h("code", null, a.artifactId)),
          h("td", null, (ArtifactKind[a.kind] ?? "").toString()),
          h("td", { class: "num" }, bytes(a.sizeBytes)),
          h("td", null, a.contentType || "—"),
          h("td", null, h("code", { title: a.sha256 }, `${a.sha256.slice(0, 12)}…`)),
          h("td", { class: "num" }, a.attempt),
          h("td", null, when(a.createdAt)),
          h("td", { class: "actions" }, button),
        );
      }),
    ),
  );
}

/** How the coordinator's delivery of the current attempt stands (a task with dispatch). */
function deliveryText(t: Task): string {
  const d = t.delivery;
  if (!d) return "dispatch on, not placed yet";
  const state = (DeliveryState[d.state] ?? "unknown").toLowerCase();
  const last =
    d.lastStatus > 0 ? `, last answer ${d.lastStatus}` : d.lastError ? `, ${d.lastError}` : "";
  return `${state} to ${shortId(d.workerId)} (attempt ${d.attempt}, ${d.tries} request(s)${last})`;
}
