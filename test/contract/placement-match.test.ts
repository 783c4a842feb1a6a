import { sql } from "drizzle-orm";
import { beforeAll, expect, it } from "vitest";
import { rowsOf } from "../../src/db/values.js";
import { unmet } from "../../src/tasks/placement.js";
import { createTaskStore, type TaskStore } from "../../src/tasks/store.js";
import { describeEachEngine } from "../support/engines.js";
import { newTask } from "../support/fixtures.js";

// Placement decides with the database's matching rule (meshwork_fits over
// meshwork_offered, src/leases/sql/match.sql); its TypeScript words of a
// mismatch are for the NO_CANDIDATE message. They must agree.
describeEachEngine("placement's matching words", (db) => {
  let tasks: TaskStore;
  beforeAll(() => {
    tasks = createTaskStore(db().db);
  });

  const workers: { capabilities: string[]; labels: Record<string, string> }[] = [
    { capabilities: [], labels: {} },
    { capabilities: ["render"], labels: {} },
    { capabilities: ["render", "gpu"], labels: { zone: "a" } },
    { capabilities: ["render"], labels: { zone: "b", slot: "brick:gpu" } },
    { capabilities: [], labels: { zone: "a", s0: "brick:render", s1: "brick:gpu" } },
    { capabilities: ["gpu"], labels: { zone: "a", s0: "bricks:render" } },
  ];
  const shapes: {
    workload: string;
    requiredCapabilities: string[];
    affinity: Record<string, string>;
  }[] = [
    { workload: "render", requiredCapabilities: [], affinity: {} },
    { workload: "render", requiredCapabilities: ["gpu"], affinity: {} },
    { workload: "render", requiredCapabilities: ["gpu"], affinity: { zone: "a" } },
    { workload: "render", requiredCapabilities: [], affinity: { zone: "b" } },
    { workload: "gpu", requiredCapabilities: [], affinity: {} },
  ];

  it("the words name nothing exactly when the database says the worker fits", async () => {
    const rows = await tasks.create(shapes.map((s) => newTask(s)));
    let fitting = 0;
    for (const task of rows) {
      for (const w of workers) {
        const [verdict] = await rowsOf<{ fits: boolean | string }>(
          db().db,
          sql`select meshwork_fits(t, meshwork_offered(array(select jsonb_array_elements_text(${JSON.stringify(w.capabilities)}::jsonb)), ${JSON.stringify(w.labels)}::jsonb),
            ${JSON.stringify(w.labels)}::jsonb)::text as fits from tasks t where t.id = ${task.id}`,
        );
        const fits = verdict?.fits === "true";
        if (fits) fitting++;
        expect({ task: task.id, w, words: unmet(w, task).length === 0 }).toEqual({
          task: task.id,
          w,
          words: fits,
        });
      }
    }
    expect(fitting).toBeGreaterThan(3);
  });
});
