import type { Task } from "../../gen/meshwork/v1/task_pb.js";
import { tasks } from "./api.js";

/** The most tasks a workflow view draws; past it the graph is cut (and says so). */
export const maxNodes = 1000;
/** The most tasks read by correlation id, over every correlation id the graph holds. */
export const maxListed = 5000;
/** GetTask calls in flight at once while walking depends_on upward. */
const concurrency = 8;

/** A task's graph as found: its tasks, what could not be read, and why it may be incomplete. */
export interface Graph {
  /** The tasks of the graph, by id (the task asked for is always one). */
  nodes: Map<string, Task>;
  /** Dependencies named by a task of the graph but not read (not found, or past the bound). */
  missing: Set<string>;
  /** Why the graph may be incomplete, in words ("" when it is whole). */
  cut: string;
  /** Tasks read by ListTasks and GetTask to find it. */
  read: number;
}

/** Runs `fn` over `items`, at most `limit` at a time. */
async function eachLimited<T>(items: T[], limit: number, fn: (item: T) => Promise<void>) {
  let next = 0;
  const run = async () => {
    while (next < items.length) {
      const item = items[next++] as T;
      await fn(item);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, run));
}

/**
 * Finds the graph of `taskId`: there is no RPC listing a task's dependents,
 * so it lists the tasks of the task's correlation id (every task of one
 * CreateTasks call shares the request's) and keeps those connected to the
 * task by depends_on, in either direction; a dependency outside those
 * lists (made by another call) is read by GetTask, and its correlation id
 * listed in turn. At most `maxNodes` tasks are kept and `maxListed` read
 * by listing; dependents made by later calls are not found.
 */
export async function findGraph(taskId: string, signal: AbortSignal): Promise<Graph> {
  const first = (await tasks.getTask({ taskId }, { signal })).task;
  if (!first) throw new Error(`GetTask answered no task for ${taskId}`);
  const pool = new Map<string, Task>([[first.taskId, first]]);
  const listed = new Set<string>();
  const missing = new Set<string>();
  let read = 1;
  let cut = "";
  let nodes = new Map<string, Task>();

  const list = async (correlationId: string) => {
    listed.add(correlationId);
    let pageToken = "";
    do {
      if (read >= maxListed) {
        cut ||= `read the newest tasks of correlation id ${correlationId} only (at most ${maxListed.toLocaleString("en")} tasks are read)`;
        return;
      }
      const r = await tasks.listTasks(
        { correlationId, pageSize: Math.min(1000, maxListed - read), pageToken },
        { signal },
      );
      read += r.tasks.length;
      for (const t of r.tasks) if (!pool.has(t.taskId)) pool.set(t.taskId, t);
      pageToken = r.nextPageToken;
    } while (pageToken !== "");
  };

  const toList = first.correlationId ? [first.correlationId] : [];
  for (let round = 0; round < 50; round++) {
    for (let c = toList.shift(); c !== undefined; c = toList.shift()) {
      if (!listed.has(c)) await list(c);
    }
    const found = connected(first.taskId, pool, missing);
    nodes = found.nodes;
    if (found.full) {
      cut ||= `the graph has more than ${maxNodes.toLocaleString("en")} tasks: the first ${maxNodes.toLocaleString("en")} found are drawn`;
      break;
    }
    // A dependency made by another call: its call's tasks may hold more of the graph.
    for (const t of nodes.values()) {
      const c = t.correlationId;
      if (c && !listed.has(c) && !toList.includes(c) && read < maxListed) toList.push(c);
    }
    const toFetch = found.unread.slice(0, maxNodes - nodes.size);
    if (toFetch.length === 0 && toList.length === 0) break;
    await eachLimited(toFetch, concurrency, async (id) => {
      try {
        const t = (await tasks.getTask({ taskId: id }, { signal })).task;
        read++;
        if (t) pool.set(t.taskId, t);
        else missing.add(id);
      } catch (e) {
        if (signal.aborted) throw e;
        missing.add(id); // Gone (retention) or not readable: counted as missing.
      }
    });
  }
  return { nodes, missing, cut, read };
}

/**
 * The tasks of `pool` connected to `start` by depends_on either way (at most
 * `maxNodes`), and the dependencies they name that the pool lacks.
 */
function connected(start: string, pool: Map<string, Task>, missing: Set<string>) {
  const dependents = new Map<string, string[]>();
  for (const t of pool.values()) {
    for (const d of t.dependsOn) dependents.set(d, [...(dependents.get(d) ?? []), t.taskId]);
  }
  const nodes = new Map<string, Task>();
  const unread = new Set<string>();
  const queue = [start];
  let full = false;
  while (queue.length) {
    const id = queue.shift() as string;
    if (nodes.has(id)) continue;
    const t = pool.get(id);
    if (!t) {
      if (!missing.has(id)) unread.add(id);
      continue;
    }
    if (nodes.size >= maxNodes) {
      full = true;
      break;
    }
    nodes.set(id, t);
    queue.push(...t.dependsOn, ...(dependents.get(id) ?? []));
  }
  return { nodes, unread: [...unread], full };
}

/** Where a task is drawn: its layer (longest path from a root) and its row in the layer. */
export interface Placed {
  task: Task;
  layer: number;
  row: number;
}

/**
 * A layered layout: each task's layer is the longest path to it from a
 * task without dependencies in the graph; inside a layer, tasks are ordered
 * by the mean row of their neighbours (a few sweeps of the barycenter
 * heuristic), which keeps most edges short and uncrossed.
 */
export function layout(nodes: Map<string, Task>): { placed: Map<string, Placed>; layers: number } {
  const layer = new Map<string, number>();
  const inGraph = (t: Task) => t.dependsOn.filter((d) => nodes.has(d));
  // Kahn's order: a layer is known once every dependency's is.
  const waiting = new Map([...nodes.values()].map((t) => [t.taskId, inGraph(t).length]));
  const dependents = new Map<string, string[]>();
  for (const t of nodes.values()) {
    for (const d of inGraph(t)) dependents.set(d, [...(dependents.get(d) ?? []), t.taskId]);
  }
  const ready = [...waiting].filter(([, n]) => n === 0).map(([id]) => id);
  while (ready.length) {
    const id = ready.shift() as string;
    const t = nodes.get(id) as Task;
    layer.set(id, Math.max(0, ...inGraph(t).map((d) => (layer.get(d) ?? 0) + 1)));
    for (const next of dependents.get(id) ?? []) {
      const left = (waiting.get(next) ?? 1) - 1;
      waiting.set(next, left);
      if (left === 0) ready.push(next);
    }
  }
  // A cycle cannot be created; should one appear, its tasks go first.
  for (const id of nodes.keys()) if (!layer.has(id)) layer.set(id, 0);

  const layers = Math.max(0, ...layer.values()) + 1;
  const rows: string[][] = Array.from({ length: layers }, () => []);
  const byName = (a: Task, b: Task) =>
    (a.ref || a.name).localeCompare(b.ref || b.name) || a.taskId.localeCompare(b.taskId);
  for (const t of [...nodes.values()].sort(byName)) rows[layer.get(t.taskId) ?? 0]?.push(t.taskId);
  const rowOf = new Map<string, number>();
  const number = () => {
    for (const r of rows) for (const [i, id] of r.entries()) rowOf.set(id, i);
  };
  number();
  const mean = (ids: string[], own: number) =>
    ids.length ? ids.reduce((s, id) => s + (rowOf.get(id) ?? 0), 0) / ids.length : own;
  for (let sweep = 0; sweep < 4; sweep++) {
    const down = sweep % 2 === 0;
    for (const r of down ? rows.slice(1) : rows.slice(0, -1).reverse()) {
      const key = new Map(
        r.map((id, i) => {
          const t = nodes.get(id) as Task;
          return [id, mean(down ? inGraph(t) : (dependents.get(id) ?? []), i)];
        }),
      );
      r.sort((a, b) => (key.get(a) ?? 0) - (key.get(b) ?? 0));
      number();
    }
  }
  const placed = new Map<string, Placed>();
  for (const [id, t] of nodes) {
    placed.set(id, { task: t, layer: layer.get(id) ?? 0, row: rowOf.get(id) ?? 0 });
  }
  return { placed, layers };
}
