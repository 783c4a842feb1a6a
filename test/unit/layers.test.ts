import { readFileSync } from "node:fs";
import { dirname, relative, resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { sourceFiles, src } from "../support/source-files.js";

// The dependency rules of ARCHITECTURE.md, checked on the source: Biome's
// noImportCycles catches file cycles; these catch imports that go up a
// layer, and cycles between folders, which make a change in one feature
// ripple into another.

/**
 * The layers of src/, bottom first: a file may import from its own folder
 * and from folders of a LOWER rank only (type imports included), never from
 * its rank or above. A top-level file (app.ts, config.ts, …) is its own
 * module. Read a failure as "file → the file it imports": move the thing
 * imported down, or pass it in through the importer's Deps.
 *
 *  0  db/            the database: connection, schema, migrations, driver quirks
 *     sdk/           the worker SDK: a client of the RPCs, importing only gen/
 *     client/        the client SDK (meshwork/client): the same, for programs that submit work
 *  1  config  log  data-dir-lock  metrics/  tracing/
 *                    settings and instruments: know nothing of the domain;
 *                    every layer above may log, count and trace
 *  2  core/          the domain's vocabulary: refusals, validators, lease
 *                    reference and check, shared SQL, paging, context keys
 *  3  artifacts/  knowledge/  auth/  scheduling/
 *                    features that use only core/ and db/ (auth: tokens,
 *                    guard, policy, the caller as kPrincipal; scheduling:
 *                    shares, limits, waiting reasons, the autoscaler's demand)
 *     logs/          task log tails: lines appended under the lease check, capped per task
 *  4  tasks/         uses artifacts/ (inputs)
 *  5  fleet/         uses tasks/ (the LOST worker's tasks), auth/ (its token)
 *     schedules/     cron schedules: their ticks create tasks through tasks/
 *  6  leases/        uses fleet/ (worker cache, heartbeats) and tasks/
 *  7  rpc/           Connect plumbing: interceptors (logging, auth, NUL),
 *                    the mapping of what handlers throw to what clients see
 *  8  http/          plain HTTP: listener, router, byte routes, /metrics
 *  9  rest/          the REST contracts: adapters that only call the RPCs
 * 10  stores         a store per handle
 * 11  app            shared state, the object every service's Deps is cut from
 * 12  server  startup
 * 13  main           start-up, signals
 * 14  cli/           the meshwork command (serve loads main.ts)
 */
const ranks: Record<string, number> = {
  db: 0,
  sdk: 0,
  client: 0,
  config: 1,
  log: 1,
  "data-dir-lock": 1,
  metrics: 1,
  tracing: 1,
  core: 2,
  artifacts: 3,
  knowledge: 3,
  auth: 3,
  scheduling: 3,
  logs: 3,
  tasks: 4,
  fleet: 5,
  schedules: 5,
  leases: 6,
  rpc: 7,
  http: 8,
  rest: 9,
  stores: 10,
  app: 11,
  server: 12,
  startup: 12,
  main: 13,
  cli: 14,
};

/** The module a file belongs to: its folder under src/, or the file itself at the top. */
function moduleOf(file: string): string {
  const [first, ...rest] = relative(src, file).split("/");
  return rest.length === 0 ? (first ?? "").replace(/\.ts$/, "") : (first ?? "");
}

/** Every import of one module by a file of another (type imports included: they couple as much). */
function imports(): { file: string; target: string; from: string; to: string }[] {
  const found = [];
  for (const file of sourceFiles(src)) {
    const text = readFileSync(file, "utf8");
    // `import … from`, `export … from`, `import "./x.js"` and `import("./x.js")`.
    const specifiers =
      /(?:^|\n)\s*(?:import|export)\b[^;]*?\bfrom\s+"(\.[^"]+)"|(?:^|\n)\s*import\s+"(\.[^"]+)"|\bimport\(\s*"(\.[^"]+)"\s*\)/g;
    for (const m of text.matchAll(specifiers)) {
      const spec = m[1] ?? m[2] ?? m[3] ?? "";
      const target = resolve(dirname(file), spec.replace(/\.js$/, ".ts"));
      if (!target.startsWith(`${src}/`)) continue; // gen/ and the like
      const [from, to] = [moduleOf(file), moduleOf(target)];
      if (to !== from)
        found.push({ file: relative(src, file), target: relative(src, target), from, to });
    }
  }
  return found;
}

/** module → the modules it imports. */
function moduleGraph(): Map<string, Set<string>> {
  const graph = new Map<string, Set<string>>();
  for (const { from, to } of imports()) {
    const edges = graph.get(from) ?? new Set<string>();
    graph.set(from, edges.add(to));
  }
  return graph;
}

/** The imports that do not go down a rank, as "file → target (rank → rank)". */
function upward(
  edges: { file: string; target: string; from: string; to: string }[],
  rankOf: Record<string, number>,
): string[] {
  return edges
    .filter(({ from, to }) => (rankOf[to] ?? Infinity) >= (rankOf[from] ?? -Infinity))
    .map(
      ({ file, target, from, to }) =>
        `${file} → ${target} (${from} is rank ${rankOf[from]}, ${to} is rank ${rankOf[to]})`,
    );
}

/** Strongly connected components with more than one module (Tarjan). */
function cycles(graph: Map<string, Set<string>>): string[][] {
  let index = 0;
  const order = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const found: string[][] = [];
  const visit = (v: string) => {
    order.set(v, index);
    low.set(v, index++);
    stack.push(v);
    for (const w of graph.get(v) ?? []) {
      if (!order.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v) ?? 0, low.get(w) ?? 0));
      } else if (stack.includes(w)) {
        low.set(v, Math.min(low.get(v) ?? 0, order.get(w) ?? 0));
      }
    }
    if (low.get(v) === order.get(v)) {
      const component: string[] = [];
      let w: string | undefined;
      do {
        w = stack.pop();
        if (w !== undefined) component.push(w);
      } while (w !== undefined && w !== v);
      if (component.length > 1) found.push(component.sort());
    }
  };
  for (const v of graph.keys()) if (!order.has(v)) visit(v);
  return found;
}

describe("layers", () => {
  const graph = moduleGraph();

  it("ranks every folder and top-level file of src/", () => {
    const modules = new Set(sourceFiles(src).map(moduleOf));
    expect([...modules].filter((m) => ranks[m] === undefined)).toEqual([]);
  });

  it("imports only from a lower rank", () => {
    expect(upward(imports(), ranks)).toEqual([]);
  });

  it("has no import cycle between folders", () => {
    expect(cycles(graph)).toEqual([]);
  });

  it("keeps db/ at the bottom and core/ right above it", () => {
    expect([...(graph.get("db") ?? [])]).toEqual([]);
    expect(
      [...(graph.get("core") ?? [])].filter((m) => ranks[m] === undefined || ranks[m] > 1),
    ).toEqual([]);
  });

  // A file past 450 lines has, so far each time, held more than one job
  // (ARCHITECTURE.md: one home per rule); split it rather than raise this.
  it("keeps every source file at 450 lines or fewer", () => {
    const long = sourceFiles(src)
      .map((file) => ({
        file: relative(src, file),
        lines: readFileSync(file, "utf8").split("\n").length - 1,
      }))
      .filter(({ lines }) => lines > 450);
    expect(long).toEqual([]);
  });

  it("finds an upward import when there is one (the check itself works)", () => {
    const edge = { file: "db/x.ts", target: "core/y.ts", from: "db", to: "core" };
    expect(upward([edge], ranks)).toEqual(["db/x.ts → core/y.ts (db is rank 0, core is rank 2)"]);
    expect(
      upward(
        [
          { ...edge, from: "sdk", file: "sdk/x.ts" },
          { ...edge, to: "nowhere" },
        ],
        ranks,
      ),
    ).toHaveLength(2);
  });

  it("finds a cycle when there is one (the check itself works)", () => {
    const g = new Map([
      ["a", new Set(["b"])],
      ["b", new Set(["c"])],
      ["c", new Set(["a"])],
      ["d", new Set(["a"])],
    ]);
    expect(cycles(g)).toEqual([["a", "b", "c"]]);
  });
});
