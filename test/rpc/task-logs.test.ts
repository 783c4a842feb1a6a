import type { MessageInitShape } from "@bufbuild/protobuf";
import { createClient, createRouterTransport } from "@connectrpc/connect";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import {
  LeaseService,
  LeaseStatus,
  type StreamLeasesRequestSchema,
} from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import { createApp } from "../../src/app.js";
import { createRoutes, rpcInterceptors } from "../../src/server.js";
import { createTestDatabase } from "../support/database.js";
import { outcome } from "../support/errors.js";
import { expireLease } from "../support/fixtures.js";
import {
  claimOne,
  createHarness,
  type Harness,
  registerWorker,
  testConfig,
  uniqueWorkload,
} from "../support/harness.js";
import { textSink } from "../support/text-sink.js";

/** A LogLine as the tests send it. */
interface Line {
  taskId: string;
  workerId: string;
  attempt: number;
  leaseToken: string;
  text: string;
  stream?: string;
}

async function* each<T>(items: T[]): AsyncIterable<T> {
  for (const i of items) yield i;
}

/** A task claimed by a new worker: its lease, and a line maker for it. */
async function leased(h: Harness) {
  const workload = uniqueWorkload("logs");
  const workerId = await registerWorker(h, [workload]);
  await h.tasks.createTask({ workload });
  const claim = await claimOne(h, workerId);
  const lease = {
    taskId: claim.taskId,
    workerId,
    attempt: claim.attempt,
    leaseToken: claim.leaseToken,
  };
  const line = (text: string, extra: Partial<Line> = {}): Line => ({ ...lease, text, ...extra });
  return { lease, workerId, taskId: claim.taskId, line };
}

const texts = (lines: { text: string }[]) => lines.map((l) => l.text);

let h: Harness;
beforeAll(async () => {
  // A small cap and budget, to see them act: 5 lines per task, 1 line/s (a burst of 10).
  h = await createHarness({ logLinesPerTask: 5, logLinesPerSecond: 1 });
});
afterAll(() => h.close());

describe("task logs", () => {
  it("keeps the lines of a held lease sent with AppendLogs; drops and counts the others", async () => {
    const t = await leased(h);
    const res = await h.leases.appendLogs(
      each([
        t.line("one", { stream: "stdout" }),
        t.line("two", { stream: "stderr" }),
        t.line("three"),
        t.line("stale", { attempt: 2 }),
        t.line("forged", { leaseToken: "f".repeat(64) }),
      ]),
    );
    expect(res).toMatchObject({ accepted: 3, dropped: 2 });
    const page = await h.tasks.getTaskLogs({ taskId: t.taskId });
    expect(texts(page.lines)).toEqual(["one", "two", "three"]);
    expect(page.lines.map((l) => l.stream)).toEqual(["stdout", "stderr", "log"]);
    expect(page.lines.every((l) => l.leaseToken === "" && l.workerId === t.workerId)).toBe(true);
    const seqs = page.lines.map((l) => l.sequence);
    expect([...seqs].sort((a, b) => (a < b ? -1 : 1))).toEqual(seqs);
    expect(page).toMatchObject({ dropped: 0n, more: false, nextAfterSequence: seqs[2] });
  });

  it("takes lines inside StreamLeases, and drops those of a lease lost", async () => {
    const t = await leased(h);
    async function* messages(): AsyncIterable<MessageInitShape<typeof StreamLeasesRequestSchema>> {
      yield {
        workerId: t.workerId,
        leases: [{ taskId: t.taskId, attempt: 1, leaseToken: t.lease.leaseToken }],
        logs: [{ ...t.lease, workerId: "", text: "beat", stream: "stdout" }],
      };
    }
    for await (const res of h.leases.streamLeases(messages())) {
      expect(res.leases[0]?.status).toBe(LeaseStatus.RENEWED);
    }
    await expireLease(h.app.database.db, t.taskId);
    const late = await h.leases.appendLogs(each([t.line("after expiry")]));
    expect(late).toMatchObject({ accepted: 0, dropped: 1 });
    const page = await h.tasks.getTaskLogs({ taskId: t.taskId });
    expect(texts(page.lines)).toEqual(["beat"]);
  });

  it("refuses StreamLeases log lines naming another worker", async () => {
    const t = await leased(h);
    const other = await registerWorker(h, [uniqueWorkload()]);
    async function* messages(): AsyncIterable<MessageInitShape<typeof StreamLeasesRequestSchema>> {
      yield { workerId: t.workerId, logs: [{ ...t.lease, workerId: other, text: "x" }] };
    }
    const run = async () => {
      for await (const _ of h.leases.streamLeases(messages()));
    };
    expect(await outcome(run())).toMatchObject({ code: "InvalidArgument" });
  });

  it("keeps the newest lines up to the cap and counts the oldest dropped", async () => {
    const t = await leased(h);
    await h.leases.appendLogs(each(["a", "b", "c"].map((x) => t.line(x))));
    const res = await h.leases.appendLogs(each(["d", "e", "f", "g"].map((x) => t.line(x))));
    expect(res).toMatchObject({ accepted: 4, dropped: 0 });
    const page = await h.tasks.getTaskLogs({ taskId: t.taskId });
    expect(texts(page.lines)).toEqual(["c", "d", "e", "f", "g"]);
    expect(page.dropped).toBe(2n);

    // One batch past the cap on its own keeps its last lines.
    const u = await leased(h);
    const many = await h.leases.appendLogs(
      each(["1", "2", "3", "4", "5", "6", "7"].map((x) => u.line(x))),
    );
    expect(many).toMatchObject({ accepted: 5, dropped: 2 });
    const kept = await h.tasks.getTaskLogs({ taskId: u.taskId });
    expect(texts(kept.lines)).toEqual(["3", "4", "5", "6", "7"]);
    expect(kept.dropped).toBe(2n);
  });

  it("drops and counts the lines past a task's rate budget", async () => {
    const t = await leased(h);
    // 12 lines against a burst of 10, in batches within the cap.
    let accepted = 0;
    let dropped = 0;
    for (const batch of [0, 1, 2]) {
      const res = await h.leases.appendLogs(
        each([0, 1, 2, 3].map((i) => t.line(`r${batch}.${i}`))),
      );
      accepted += res.accepted;
      dropped += res.dropped;
    }
    expect({ accepted, dropped }).toEqual({ accepted: 10, dropped: 2 });
    const page = await h.tasks.getTaskLogs({ taskId: t.taskId });
    // The cap keeps the newest 5 of the 10 taken: 2 refused by the budget, 5 by the cap.
    expect(texts(page.lines)).toEqual(["r1.1", "r1.2", "r1.3", "r2.0", "r2.1"]);
    expect(page.dropped).toBe(7n);
  });

  it("pages by after_sequence and filters by attempt", async () => {
    const t = await leased(h);
    await h.leases.appendLogs(each(["p1", "p2", "p3"].map((x) => t.line(x))));
    const first = await h.tasks.getTaskLogs({ taskId: t.taskId, pageSize: 2 });
    expect(texts(first.lines)).toEqual(["p1", "p2"]);
    expect(first.more).toBe(true);
    const second = await h.tasks.getTaskLogs({
      taskId: t.taskId,
      pageSize: 2,
      afterSequence: first.nextAfterSequence,
    });
    expect(texts(second.lines)).toEqual(["p3"]);
    expect(second.more).toBe(false);
    const empty = await h.tasks.getTaskLogs({
      taskId: t.taskId,
      afterSequence: second.nextAfterSequence,
    });
    expect(empty).toMatchObject({ lines: [], nextAfterSequence: second.nextAfterSequence });
    const other = await h.tasks.getTaskLogs({ taskId: t.taskId, attempt: 2 });
    expect(other.lines).toEqual([]);
  });

  it("watches: the kept lines, then new ones, and ends when the task finishes", async () => {
    const t = await leased(h);
    await h.leases.appendLogs(each([t.line("before")]));
    const seen: string[] = [];
    let sent = false;
    for await (const res of h.tasks.watchTaskLogs({ taskId: t.taskId })) {
      seen.push(...texts(res.lines));
      if (!sent) {
        sent = true;
        await h.leases.appendLogs(each([t.line("during")]));
        await h.leases.completeTask(t.lease);
      }
    }
    expect(seen).toEqual(["before", "during"]);
  });

  it("refuses bad input and an unknown task; cuts a long line", async () => {
    const t = await leased(h);
    const bad = [
      t.line("x", { stream: "stdin" }),
      t.line("x", { taskId: "nope" }),
      t.line("x", { attempt: 0 }),
      t.line("x", { workerId: "" }),
      t.line("x", { leaseToken: "t".repeat(300) }),
    ];
    for (const line of bad) {
      expect(await outcome(h.leases.appendLogs(each([line])))).toMatchObject({
        code: "InvalidArgument",
      });
    }
    expect(await outcome(h.tasks.getTaskLogs({ taskId: t.taskId, pageSize: 5001 }))).toMatchObject({
      code: "InvalidArgument",
    });
    expect(
      await outcome(h.tasks.getTaskLogs({ taskId: "6a1d0b7e-0000-4000-8000-000000000000" })),
    ).toMatchObject({ code: "NotFound" });
    await h.leases.appendLogs(each([t.line("é".repeat(5000))]));
    const [long] = (await h.tasks.getTaskLogs({ taskId: t.taskId })).lines;
    expect(long?.text.endsWith("…")).toBe(true);
    expect(Buffer.byteLength(long?.text ?? "")).toBeLessThanOrEqual(8192);
    expect(long?.text.startsWith("éé")).toBe(true);
  });
});

describe("task logs with tokens", () => {
  let a: Harness;
  beforeAll(async () => {
    a = await createHarness({ auth: "on" });
  });
  afterAll(() => a.close());

  it("lets a worker token send only for its own workers, and clients read", async () => {
    const [mine, theirs, client] = [
      await a.token("worker"),
      await a.token("worker"),
      await a.token("client"),
    ];
    const admin = await a.token("admin");
    const workload = uniqueWorkload();
    const { workerId } = await a.as(FleetService, mine).registerWorker({
      name: "w",
      capabilities: [workload],
      maxConcurrency: 1,
    });
    await a.as(TaskService, admin).createTask({ workload });
    const claim = await claimOne({ leases: a.as(LeaseService, mine) }, workerId);
    const line = {
      taskId: claim.taskId,
      workerId,
      attempt: 1,
      leaseToken: claim.leaseToken,
      text: "hi",
    };
    expect(await outcome(a.as(LeaseService, theirs).appendLogs(each([line])))).toMatchObject({
      code: "PermissionDenied",
    });
    expect(await a.as(LeaseService, mine).appendLogs(each([line]))).toMatchObject({
      accepted: 1,
    });
    const page = await a.as(TaskService, client).getTaskLogs({ taskId: claim.taskId });
    expect(texts(page.lines)).toEqual(["hi"]);
    expect(
      await outcome(a.as(TaskService, mine).getTaskLogs({ taskId: claim.taskId })),
    ).toMatchObject({ code: "PermissionDenied" });
  });
});

describe("the coordinator's own log", () => {
  it("never holds a line's text", async () => {
    const sink = textSink();
    const db = await createTestDatabase();
    const app = createApp(db.database, testConfig(), pino({ level: "trace" }, sink.stream));
    await app.start({ sweeper: false });
    try {
      const transport = createRouterTransport(createRoutes(app), {
        router: { interceptors: rpcInterceptors(app) },
      });
      const c = {
        fleet: createClient(FleetService, transport),
        tasks: createClient(TaskService, transport),
        leases: createClient(LeaseService, transport),
      } as unknown as Harness;
      const t = await leased(c);
      const secret = "user-secret-line-7f3a";
      await c.leases
        .appendLogs(each([t.line(secret), t.line(secret, { stream: "bogus" })]))
        .catch(() => {});
      await c.tasks.getTaskLogs({ taskId: t.taskId });
      expect(sink.text()).toContain("rpc");
      expect(sink.text()).not.toContain(secret);
    } finally {
      await app.stop();
      await db.drop();
    }
  });
});
