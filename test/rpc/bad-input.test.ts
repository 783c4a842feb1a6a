import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { TimestampSchema } from "@bufbuild/protobuf/wkt";
import { createClient, createRouterTransport } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import { KnowledgeService } from "../../gen/meshwork/v1/knowledge_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { createRoutes, rpcInterceptors } from "../../src/server.js";
import { createTestDatabase, onPostgres } from "../support/database.js";
import { outcome } from "../support/errors.js";
import { expireLease } from "../support/fixtures.js";
import {
  appOn,
  claimOne,
  createHarness,
  type Harness,
  registerWorker,
  uniqueWorkload,
} from "../support/harness.js";

let h: Harness;
beforeAll(async () => {
  h = await createHarness();
});
afterAll(() => h.close());

const unknownId = "00000000-0000-4000-8000-000000000000";

/** A claimed task and a lease-bound request template for it. */
async function leased() {
  const workload = uniqueWorkload();
  const workerId = await registerWorker(h, [workload]);
  await h.tasks.createTask({ workload });
  const claim = await claimOne(h, workerId);
  const lease = {
    taskId: claim.taskId,
    workerId,
    attempt: claim.attempt,
    leaseToken: claim.leaseToken,
  };
  const snapshot = async () => (await h.tasks.getTask({ taskId: claim.taskId })).task;
  return { workload, workerId, claim, lease, snapshot };
}

async function tasksWithCorrelation(correlationId: string) {
  return (await h.tasks.listTasks({ correlationId })).tasks.length;
}

describe("bad input: each refused with its code, nothing changed", () => {
  it("empty workload is invalid_argument and creates nothing", async () => {
    const correlationId = randomUUID();
    expect(await outcome(h.tasks.createTask({ workload: "", correlationId }))).toMatchObject({
      code: "InvalidArgument",
      message: "workload is required",
    });
    expect(await tasksWithCorrelation(correlationId)).toBe(0);
  });

  it.each([4, 86_401])(
    "lease_seconds %i is out of range and creates nothing",
    async (leaseSeconds) => {
      const correlationId = randomUUID();
      const res = await outcome(h.tasks.createTask({ workload: "w", leaseSeconds, correlationId }));
      expect(res.code).toBe("InvalidArgument");
      expect(res.message).toContain("lease_seconds");
      expect(await tasksWithCorrelation(correlationId)).toBe(0);
    },
  );

  it("a batch with one bad task creates none of it", async () => {
    const correlationId = randomUUID();
    const res = await outcome(
      h.tasks.createTasks({
        tasks: [
          { workload: "w", correlationId },
          { workload: "w", correlationId, maxAttempts: 0 },
        ],
      }),
    );
    expect(res).toMatchObject({ code: "InvalidArgument" });
    expect(res.message).toContain("tasks[1].max_attempts");
    expect(await tasksWithCorrelation(correlationId)).toBe(0);
    const tooMany = Array.from({ length: 1001 }, () => ({ workload: "w", correlationId }));
    expect((await outcome(h.tasks.createTasks({ tasks: tooMany }))).code).toBe("InvalidArgument");
    expect(await tasksWithCorrelation(correlationId)).toBe(0);
  });

  it("an idempotency key reused with other content is already_exists; the first task stands", async () => {
    const key = randomUUID();
    const correlationId = randomUUID();
    const { task } = await h.tasks.createTask({
      workload: "w",
      idempotencyKey: key,
      priority: 1,
      correlationId,
    });
    const same = await h.tasks.createTask({
      workload: "w",
      idempotencyKey: key,
      priority: 1,
      correlationId,
    });
    expect(same.task?.taskId).toBe(task?.taskId);
    const other = await outcome(
      h.tasks.createTask({ workload: "w", idempotencyKey: key, priority: 2, correlationId }),
    );
    expect(other).toMatchObject({ code: "AlreadyExists", reason: "IDEMPOTENCY_KEY_REUSED" });
    expect(await tasksWithCorrelation(correlationId)).toBe(1);
  });

  it.each([101, -1])("max_tasks %i is out of range; the task stays PENDING", async (maxTasks) => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);
    const { task } = await h.tasks.createTask({ workload });
    expect((await outcome(h.leases.claimTasks({ workerId, maxTasks }))).code).toBe(
      "InvalidArgument",
    );
    expect((await outcome(h.leases.claimTasks({ workerId, waitSeconds: 31 }))).code).toBe(
      "InvalidArgument",
    );
    expect((await h.tasks.getTask({ taskId: task?.taskId ?? "" })).task?.state).toBe(
      TaskState.PENDING,
    );
  });

  it("unknown and malformed ids are not_found and invalid_argument", async () => {
    expect((await outcome(h.tasks.getTask({ taskId: unknownId }))).code).toBe("NotFound");
    expect((await outcome(h.tasks.getTask({ taskId: "42" }))).code).toBe("InvalidArgument");
    expect((await outcome(h.leases.claimTasks({ workerId: unknownId }))).code).toBe("NotFound");
    expect((await outcome(h.fleet.heartbeat({ workerId: unknownId }))).code).toBe("NotFound");
    expect((await outcome(h.tasks.cancelTask({ taskId: unknownId }))).code).toBe("NotFound");
    expect(
      (await outcome(h.leases.completeTask({ taskId: unknownId, workerId: unknownId, attempt: 1 })))
        .code,
    ).toBe("NotFound");
  });

  it("a stale attempt, a foreign worker and a wrong token are aborted with their reasons", async () => {
    const { lease, snapshot } = await leased();
    const before = await snapshot();
    const other = await registerWorker(h, ["x"]);
    const cases = [
      [{ ...lease, attempt: 2 }, "STALE_ATTEMPT"],
      [{ ...lease, workerId: other }, "FOREIGN_WORKER"],
      [{ ...lease, leaseToken: "0".repeat(64) }, "TOKEN_MISMATCH"],
    ] as const;
    for (const [req, reason] of cases) {
      expect(await outcome(h.leases.renewLease(req))).toMatchObject({ code: "Aborted", reason });
      expect(await outcome(h.leases.completeTask(req))).toMatchObject({ code: "Aborted", reason });
      expect(await outcome(h.leases.failTask(req))).toMatchObject({ code: "Aborted", reason });
      expect(await outcome(h.leases.releaseTask(req))).toMatchObject({ code: "Aborted", reason });
    }
    expect(await snapshot()).toEqual(before);
  });

  it("an expired lease is aborted (LEASE_EXPIRED) and the completion is not applied", async () => {
    const { lease, snapshot } = await leased();
    await expireLease(h.app.database.db, lease.taskId);
    const before = await snapshot();
    expect(await outcome(h.leases.completeTask({ ...lease, resultSummary: "late" }))).toMatchObject(
      {
        code: "Aborted",
        reason: "LEASE_EXPIRED",
      },
    );
    expect(await snapshot()).toEqual(before);
  });

  it("a cancelled task refuses its worker (TASK_CANCELED) and cannot be cancelled again", async () => {
    const { lease, snapshot } = await leased();
    await h.tasks.cancelTask({ taskId: lease.taskId });
    const before = await snapshot();
    expect(await outcome(h.leases.completeTask(lease))).toMatchObject({
      code: "Aborted",
      reason: "TASK_CANCELED",
    });
    expect(await outcome(h.tasks.cancelTask({ taskId: lease.taskId }))).toMatchObject({
      code: "FailedPrecondition",
    });
    expect(await snapshot()).toEqual(before);
  });

  it("completing a terminal task with another manifest is already_exists; the first result stands", async () => {
    const { lease, snapshot } = await leased();
    await h.leases.completeTask({ ...lease, resultSummary: "first" });
    const before = await snapshot();
    expect((await h.leases.completeTask({ ...lease, resultSummary: "first" })).task?.state).toBe(
      TaskState.SUCCEEDED,
    );
    expect(
      await outcome(h.leases.completeTask({ ...lease, resultSummary: "second" })),
    ).toMatchObject({
      code: "AlreadyExists",
      reason: "COMPLETION_CONFLICT",
    });
    expect(await snapshot()).toEqual(before);
  });

  it("a result uri the coordinator did not issue is invalid_argument", async () => {
    const { lease, snapshot } = await leased();
    const before = await snapshot();
    const artifactId = randomUUID();
    for (const uri of [
      "file:///etc/passwd",
      `worker://w1/${artifactId}`,
      `http://elsewhere.example/artifacts/${artifactId}/download`,
    ]) {
      const res = await outcome(
        h.leases.completeTask({ ...lease, result: { artifactId, uri, sha256: "a".repeat(64) } }),
      );
      expect(res).toMatchObject({ code: "InvalidArgument", reason: "FOREIGN_URI" });
    }
    expect(await snapshot()).toEqual(before);
  });

  it("renewal extend_seconds outside 60–86400 is invalid_argument", async () => {
    const { lease, snapshot } = await leased();
    const before = await snapshot();
    expect((await outcome(h.leases.renewLease({ ...lease, extendSeconds: 59 }))).code).toBe(
      "InvalidArgument",
    );
    expect(await snapshot()).toEqual(before);
  });

  it("a lease token over 256 characters is invalid_argument wherever a lease is named, never cut", async () => {
    const { lease, snapshot } = await leased();
    const before = await snapshot();
    const long = { ...lease, leaseToken: "a".repeat(257) };
    const refusals: [string, () => Promise<unknown>][] = [
      ["lease_token", () => h.leases.startTask(long)],
      ["lease_token", () => h.leases.renewLease(long)],
      ["lease_token", () => h.leases.failTask(long)],
      [
        "leases[0].lease_token",
        async () => {
          for await (const _ of h.leases.streamLeases(
            (async function* () {
              yield { workerId: lease.workerId, leases: [long] };
            })(),
          ))
            break;
        },
      ],
      [
        "lease_token",
        () =>
          createClient(ArtifactService, h.transport).uploadArtifact(
            (async function* () {
              yield {
                payload: {
                  case: "header" as const,
                  value: { ...long, filename: "out.txt", contentType: "text/plain" },
                },
              };
            })(),
          ),
      ],
    ];
    for (const [field, call] of refusals) {
      const o = await outcome(call());
      expect(o.code, field).toBe("InvalidArgument");
      expect(o.message, field).toContain(field);
    }
    // A batch answers the bad item in its place.
    const batch = await h.leases.completeTasks({ completions: [long] });
    const item = batch.results[0]?.outcome;
    expect(item?.case === "error" && item.value).toMatchObject({
      code: "invalid_argument",
      message: expect.stringContaining("completions[0].lease_token"),
    });
    // 256 characters is a token (just not this lease's).
    const [at256] = [{ ...lease, leaseToken: "a".repeat(256) }];
    expect(await outcome(h.leases.renewLease(at256))).toMatchObject({ reason: "TOKEN_MISMATCH" });
    expect(await snapshot()).toEqual(before);
  });

  it("times outside 0001–9999 are invalid_argument, never a statement that fails", async () => {
    const knowledge = h.as(KnowledgeService, "");
    // 9999-12-31T23:59:59.999999999Z rounds up to year 10000 as a Date.
    const lastNano = create(TimestampSchema, { seconds: 253_402_300_799n, nanos: 999_999_999 });
    const year10000 = create(TimestampSchema, { seconds: 253_402_300_800n });
    const correlationId = randomUUID();
    for (const deadline of [lastNano, year10000]) {
      expect(
        await outcome(h.tasks.createTask({ workload: "w", deadline, correlationId })),
      ).toMatchObject({ code: "InvalidArgument" });
    }
    expect(await tasksWithCorrelation(correlationId)).toBe(0);
    const exported = (async () => {
      for await (const _ of knowledge.exportKnowledge({ since: lastNano }));
    })();
    expect(await outcome(exported)).toMatchObject({ code: "InvalidArgument" });
    const imported = await knowledge.importKnowledge({
      entries: [{ kind: "k", key: randomUUID(), version: 1n, updatedAt: lastNano, origin: "o" }],
    });
    expect(imported).toMatchObject({ inserted: 0n, rejected: 1n });
    const token = (at: number, ...keys: string[]) =>
      Buffer.from(JSON.stringify([at, ...keys])).toString("base64url");
    expect(await outcome(h.tasks.listTasks({ pageToken: token(1e20, unknownId) }))).toMatchObject({
      code: "InvalidArgument",
      reason: "INVALID_PAGE_TOKEN",
    });
    expect(
      await outcome(knowledge.listEntries({ pageToken: token(253_402_300_800_000, "k", "a") })),
    ).toMatchObject({ code: "InvalidArgument", reason: "INVALID_PAGE_TOKEN" });
  });

  it("a string with U+0000 is invalid_argument wherever it is, and nothing is stored", async () => {
    const knowledge = h.as(KnowledgeService, "");
    const correlationId = randomUUID();
    const refused = [
      h.tasks.createTask({ workload: "a\u0000b", correlationId }),
      h.tasks.createTask({ workload: "w", parameters: { k: ["\u0000"] }, correlationId }),
      h.tasks.createTask({ workload: "w", parameters: { "\u0000": 1 }, correlationId }),
      h.fleet.listWorkers({ capability: "\u0000" }),
      knowledge.putEntry({ kind: "k", key: "\u0000", value: {} }),
      // Inside a page token, where no interceptor looks.
      knowledge.listEntries({
        pageToken: Buffer.from(JSON.stringify([0, "\u0000", "k"])).toString("base64url"),
      }),
    ];
    for (const call of refused) {
      expect(await outcome(call)).toMatchObject({ code: "InvalidArgument" });
    }
    expect(await tasksWithCorrelation(correlationId)).toBe(0);
  });

  it("a lone surrogate (Connect JSON's \\ud800) is invalid_argument wherever it is, and nothing is stored", async () => {
    // Binary protobuf cannot carry one (UTF-8 has no form for it); JSON can.
    const json = createRouterTransport(createRoutes(h.app), {
      router: { interceptors: rpcInterceptors(h.app) },
      transport: { useBinaryFormat: false },
    });
    const tasks = createClient(TaskService, json);
    const leases = createClient(LeaseService, json);
    const correlationId = randomUUID();
    const { lease, snapshot } = await leased();
    const before = await snapshot();
    for (const call of [
      () => tasks.createTask({ workload: "w", parameters: { k: ["a\ud800"] }, correlationId }),
      () => tasks.createTask({ workload: "w", parameters: { "\udc00": 1 }, correlationId }),
      () => leases.completeTask({ ...lease, resultSummary: "done \ud800" }),
      () => leases.completeTasks({ completions: [{ ...lease, resultValue: { v: "\udfff" } }] }),
    ]) {
      // A string field is refused by the JSON decoder itself (invalid UTF8);
      // a Struct's strings and keys by the coordinator.
      expect(await outcome(call())).toMatchObject({
        code: "InvalidArgument",
        message: expect.stringMatching(/not valid Unicode text|invalid UTF8/),
      });
    }
    expect(await tasksWithCorrelation(correlationId)).toBe(0);
    expect(await snapshot()).toEqual(before);
  });

  it("NaN or an infinity in a JSON field (a binary Struct can hold them) is invalid_argument, and nothing is stored", async () => {
    const knowledge = h.as(KnowledgeService, "");
    const correlationId = randomUUID();
    const { lease, snapshot } = await leased();
    const before = await snapshot();
    const refused = [
      h.tasks.createTask({ workload: "w", parameters: { x: Number.NaN }, correlationId }),
      h.tasks.createTasks({
        tasks: [
          { workload: "w", correlationId },
          { workload: "w", parameters: { deep: [{ y: Number.POSITIVE_INFINITY }] }, correlationId },
        ],
      }),
      h.leases.completeTask({ ...lease, resultValue: { v: Number.NEGATIVE_INFINITY } }),
      knowledge.putEntry({ kind: "k", key: `nan-${correlationId}`, value: { x: Number.NaN } }),
    ];
    for (const call of refused) {
      expect(await outcome(call)).toMatchObject({
        code: "InvalidArgument",
        message: expect.stringMatching(/holds NaN or an infinity/),
      });
    }
    expect(await tasksWithCorrelation(correlationId)).toBe(0);
    expect(await snapshot()).toEqual(before);
    expect(
      await outcome(knowledge.getEntry({ kind: "k", key: `nan-${correlationId}` })),
    ).toMatchObject({ code: "NotFound" });
  });

  it("a database gone under the app reaches the client with no driver detail: unavailable on PostgreSQL, internal on a closed PGlite", async () => {
    const tdb = await createTestDatabase();
    const app = appOn(tdb.database);
    const transport = createRouterTransport(createRoutes(app), {
      router: { interceptors: rpcInterceptors(app) },
    });
    const { TaskService } = await import("../../gen/meshwork/v1/task_pb.js");
    const client = createClient(TaskService, transport);
    await tdb.drop(); // the database goes away under the running app
    const res = await outcome(client.getTask({ taskId: unknownId }));
    // PostgreSQL's connections end: the database may come back, retry. A
    // closed embedded database does not come back: that is a bug.
    expect(res).toEqual(
      onPostgres
        ? {
            code: "Unavailable",
            reason: "",
            message: "the database is unavailable for a moment; retry",
          }
        : { code: "Internal", reason: "", message: "internal error" },
    );
  });
});

describe("refusals that quote what was sent", () => {
  it("cut the quote: a 5,000-character token name makes no 5 KB answer", async () => {
    const { TokenService } = await import("../../gen/meshwork/v1/token_pb.js");
    const tokens = createClient(TokenService, h.transport);
    const refused = await outcome(tokens.revokeToken({ name: "n".repeat(5000) }));
    expect(refused.code).toBe("NotFound");
    expect(refused.message.length).toBeLessThanOrEqual(512);
    expect(refused.message.endsWith("…")).toBe(true);
  });
});
