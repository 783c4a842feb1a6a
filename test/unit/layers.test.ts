import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

// The dependency rules of ARCHITECTURE.md, checked on the source: Biome's
// noImportCycles catches file cycles; these catch cycles between folders,
// which make a change in one feature ripple into another.

const src = resolve(dirname(fileURLToPath(import.meta.url)), "../../src");

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return sourceFiles(path);
    return e.name.endsWith(".ts") ? [path] : [];
  });
}

/** The module a file belongs to: its folder under src/, or the file itself at the top. */
function moduleOf(file: string): string {
  const [first, ...rest] = relative(src, file).split("/");
  return rest.length === 0 ? (first ?? "").replace(/\.ts$/, "") : (first ?? "");
}

/** module → the modules it imports (type imports included: they couple as much). */
function moduleGraph(): Map<string, Set<string>> {
  const graph = new Map<string, Set<string>>();
  for (const file of sourceFiles(src)) {
    const from = moduleOf(file);
    const edges = graph.get(from) ?? new Set<string>();
    graph.set(from, edges);
    const text = readFileSync(file, "utf8");
    for (const m of text.matchAll(/(?:^|\n)\s*(?:import|export)\b[^;]*?\bfrom\s+"(\.[^"]+)"/g)) {
      const target = resolve(dirname(file), (m[1] ?? "").replace(/\.js$/, ".ts"));
      if (!target.startsWith(`${src}/`)) continue; // gen/ and the like
      const to = moduleOf(target);
      if (to !== from) edges.add(to);
    }
  }
  return graph;
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

  it("has no import cycle between folders", () => {
    expect(cycles(graph)).toEqual([]);
  });

  it("keeps db/ at the bottom and core/ right above it", () => {
    expect([...(graph.get("db") ?? [])]).toEqual([]);
    expect([...(graph.get("core") ?? [])].filter((m) => m !== "db")).toEqual([]);
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
