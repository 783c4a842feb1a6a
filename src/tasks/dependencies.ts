import { durationMs, timestampDate } from "@bufbuild/protobuf/wkt";
import { type CreateTaskRequest, DependencyPolicy } from "../../gen/meshwork/v1/task_pb.js";
import { invalid } from "../core/errors.js";
import { intInRange, isStorableTime, isUuid } from "../core/validate.js";

// The workflow fields of a create request — when it may start, what it
// waits for, how long an attempt may run — checked, and the references
// between the tasks of one CreateTasks call resolved into a graph with no
// cycle. The database side (edges, counts, release) is tasks/create.ts and
// tasks/sql/dependencies.sql.

const yearMs = 366 * 86_400_000;
const refPattern = /^[A-Za-z0-9._-]{1,128}$/;
/** The most tasks one task may wait for. */
export const maxDependencies = 1000;

/** The workflow fields of a NewTask, as the request gave them. */
export interface WorkflowFields {
  /** run_at as given (a time), or null. */
  runAt: Date | null;
  /** delay as given, in milliseconds, or null: run_at is then the insert's now() + delay. */
  delayMs: number | null;
  ref: string;
  /** As given: task ids and `ref:NAME`s (what the request hash counts). */
  dependsOn: string[];
  dependencyPolicy: "ALL_SUCCEEDED" | "ALL_DONE";
  timeoutSeconds: number | null;
}

/** Checks a request's workflow fields; `field` prefixes messages ("tasks[3]."). */
export function workflowOf(req: CreateTaskRequest, field: string): WorkflowFields {
  let runAt: Date | null = null;
  let delayMs: number | null = null;
  if (req.start.case === "runAt") {
    const t = req.start.value;
    runAt = timestampDate(t);
    if (!isStorableTime(runAt) || t.nanos < 0 || t.nanos > 999_999_999) {
      throw invalid(`${field}run_at is not a valid time`);
    }
    if (runAt.getTime() > Date.now() + yearMs) {
      throw invalid(`${field}run_at is more than a year ahead`);
    }
  } else if (req.start.case === "delay") {
    const ms = durationMs(req.start.value);
    if (!(ms >= 0 && ms <= yearMs) || req.start.value.nanos < 0) {
      throw invalid(`${field}delay must be from 0 to 1 year`);
    }
    delayMs = Math.round(ms);
  }
  if (req.ref !== "" && !refPattern.test(req.ref)) {
    throw invalid(`${field}ref must be 1 to 128 characters of [A-Za-z0-9._-]`);
  }
  if (req.dependsOn.length > maxDependencies) {
    throw invalid(`${field}depends_on names more than ${maxDependencies} tasks`);
  }
  // Task ids as the database writes them (lowercase), so that the same task
  // named twice is seen as one.
  const dependsOn = req.dependsOn.map((d) => (d.startsWith("ref:") ? d : d.toLowerCase()));
  const seen = new Set<string>();
  for (const [i, d] of dependsOn.entries()) {
    const name = d.startsWith("ref:") ? d.slice(4) : undefined;
    if (name === undefined ? !isUuid(d) : !refPattern.test(name)) {
      throw invalid(
        `${field}depends_on[${i}] is neither a task id nor ref:NAME: ${JSON.stringify(d.slice(0, 140))}`,
      );
    }
    if (seen.has(d)) throw invalid(`${field}depends_on names ${d} twice`);
    seen.add(d);
  }
  const policy = req.dependencyPolicy;
  if (!(policy in DependencyPolicy)) {
    throw invalid(`${field}dependency_policy ${policy} is not a DependencyPolicy`);
  }
  return {
    runAt,
    delayMs,
    ref: req.ref,
    dependsOn,
    dependencyPolicy: policy === DependencyPolicy.ALL_DONE ? "ALL_DONE" : "ALL_SUCCEEDED",
    timeoutSeconds:
      req.timeoutSeconds === undefined
        ? null
        : intInRange(`${field}timeout_seconds`, req.timeoutSeconds, 1, 604_800),
  };
}

/**
 * The dependencies of each task of one create call, as task ids: `ref:NAME`
 * becomes the id of the call's task with that ref. Refused: a ref given
 * twice, a reference to no task of the call, a task that depends on itself,
 * and a cycle (named by one of its tasks). Existing ids are checked by the
 * store, in its transaction.
 */
export function resolveDependencies(
  entries: readonly { id: string; ref: string; dependsOn: readonly string[] }[],
): string[][] {
  const byRef = new Map<string, number>();
  for (const [i, e] of entries.entries()) {
    if (e.ref === "") continue;
    if (byRef.has(e.ref))
      throw invalid(`tasks[${i}].ref ${e.ref} is used by tasks[${byRef.get(e.ref)}] too`);
    byRef.set(e.ref, i);
  }
  const edges: number[][] = entries.map(() => []);
  const resolved = entries.map((e, i) =>
    e.dependsOn.map((d) => {
      if (!d.startsWith("ref:")) {
        if (d === e.id) throw invalid(`tasks[${i}] depends on itself`);
        return d;
      }
      const j = byRef.get(d.slice(4));
      if (j === undefined) throw invalid(`tasks[${i}].depends_on: no task of this call has ${d}`);
      if (j === i) throw invalid(`tasks[${i}] depends on itself (${d})`);
      edges[i]?.push(j);
      return entries[j]?.id ?? "";
    }),
  );
  // Kahn's algorithm: what is left after taking every task whose
  // dependencies are all taken lies on a cycle or behind one.
  const waiting = edges.map((e) => e.length);
  const dependents: number[][] = entries.map(() => []);
  for (const [i, e] of edges.entries()) for (const j of e) dependents[j]?.push(i);
  const ready = waiting.flatMap((n, i) => (n === 0 ? [i] : []));
  let taken = 0;
  while (ready.length > 0) {
    const i = ready.pop() as number;
    taken += 1;
    for (const k of dependents[i] ?? []) {
      waiting[k] = (waiting[k] ?? 0) - 1;
      if (waiting[k] === 0) ready.push(k);
    }
  }
  if (taken < entries.length) {
    const stuck = waiting.findIndex((n) => n > 0);
    throw invalid(
      `tasks[${stuck}] is on a dependency cycle (or waits for one): depends_on must not loop`,
    );
  }
  return resolved;
}
