import { describe, expect, it } from "vitest";
import { createStatementEvents } from "../../src/db/observe.js";
import {
  capWorkloads,
  createMetrics,
  type LiveTaskCount,
  maxWorkloads,
  otherWorkloads,
} from "../../src/metrics/metrics.js";

function metricsWith(liveTasks: () => Promise<LiveTaskCount[]>) {
  const statements = createStatementEvents();
  const metrics = createMetrics({
    statements,
    pool: () => ({ size: 10, inUse: 3, waiting: 2 }),
    liveTasks,
  });
  return { metrics, statements };
}

describe("metrics", () => {
  it("reads the task counts once for scrapes within 2 s", async () => {
    let reads = 0;
    const { metrics } = metricsWith(async () => {
      reads++;
      return [
        { workload: "render", state: "PENDING", count: 4, oldestSeconds: 12.5 },
        { workload: "render", state: "RUNNING", count: 2, oldestSeconds: null },
      ];
    });
    const first = await metrics.scrape();
    await metrics.scrape();
    expect(reads).toBe(1);
    expect(first).toContain("meshwork_task_gauges_up 1");
    expect(first).toContain('meshwork_tasks{state="PENDING",workload="render"} 4');
    expect(first).toContain('meshwork_tasks{state="RUNNING",workload="render"} 2');
    expect(first).toContain('meshwork_backlog_oldest_pending_seconds{workload="render"} 12.5');
    expect(first).toContain('meshwork_db_pool_connections{state="in_use"} 3');
    expect(first).toContain('meshwork_db_pool_connections{state="waiting"} 2');
  });

  it("serves the other metrics when the task counts cannot be read, and asks again next time", async () => {
    let reads = 0;
    const { metrics } = metricsWith(async () => {
      reads++;
      throw new Error("connection refused");
    });
    const text = await metrics.scrape();
    expect(text).toContain("meshwork_task_gauges_up 0");
    expect(text).toContain("meshwork_rpc_requests_total");
    expect(text).not.toMatch(/^meshwork_tasks\{/m);
    await metrics.scrape();
    expect(reads).toBe(2);
  });

  it("observes statements by name, failures counted apart", async () => {
    const { metrics, statements } = metricsWith(async () => []);
    statements.started("update tasks")();
    statements.started("update tasks")(new Error("deadlock"));
    const text = await metrics.scrape();
    expect(text).toContain(
      'meshwork_db_statement_duration_seconds_count{statement="update tasks"} 2',
    );
    expect(text).toContain('meshwork_db_statement_errors_total{statement="update tasks"} 1');
  });
});

describe("workload labels are bounded", () => {
  it("the work counters keep the first 500 workload names and count the rest as _other", async () => {
    const { metrics } = metricsWith(async () => []);
    for (let i = 0; i < maxWorkloads + 250; i++) metrics.tasksCreated.inc({ workload: `w${i}` });
    metrics.tasksCreated.inc({ workload: "w0" }, 2);
    const text = await metrics.scrape();
    const series = text.split("\n").filter((l) => l.startsWith("meshwork_tasks_created_total{"));
    expect(series).toHaveLength(maxWorkloads + 1);
    expect(text).toContain('meshwork_tasks_created_total{workload="w0"} 3');
    expect(text).toContain(`meshwork_tasks_created_total{workload="${otherWorkloads}"} 250`);
  });

  it("the task gauges keep the busiest workloads and sum the rest per state", () => {
    const rows: LiveTaskCount[] = Array.from({ length: maxWorkloads + 10 }, (_, i) => ({
      workload: `w${i}`,
      state: "PENDING",
      count: i + 1,
      oldestSeconds: i,
    }));
    const capped = capWorkloads(rows);
    expect(new Set(capped.map((r) => r.workload)).size).toBe(maxWorkloads);
    const other = capped.find((r) => r.workload === otherWorkloads);
    // The 11 quietest (counts 1..11, ages 0..10) summed; the busiest kept by name.
    expect(other).toMatchObject({ state: "PENDING", count: 66, oldestSeconds: 10 });
    expect(capped.some((r) => r.workload === `w${maxWorkloads + 9}`)).toBe(true);
    expect(capped.reduce((n, r) => n + r.count, 0)).toBe(rows.reduce((n, r) => n + r.count, 0));
  });
});
