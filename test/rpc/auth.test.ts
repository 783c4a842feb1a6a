import type { DescMethod, DescService } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Health } from "../../gen/grpc/health/v1/health_pb.js";
import { ServerReflection } from "../../gen/grpc/reflection/v1/reflection_pb.js";
import { ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import { ConcurrencyService } from "../../gen/meshwork/v1/concurrency_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { KnowledgeService } from "../../gen/meshwork/v1/knowledge_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { ScheduleService } from "../../gen/meshwork/v1/schedule_pb.js";
import { ShareService } from "../../gen/meshwork/v1/share_pb.js";
import { TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { TokenRole, TokenService } from "../../gen/meshwork/v1/token_pb.js";
import { policy } from "../../src/auth/policy.js";
import type { TokenRoleName } from "../../src/db/schema/index.js";
import { outcome } from "../support/errors.js";
import { createHarness, type Harness, uniqueWorkload } from "../support/harness.js";

const services: DescService[] = [
  FleetService,
  TaskService,
  LeaseService,
  ArtifactService,
  KnowledgeService,
  TokenService,
  ShareService,
  ConcurrencyService,
  ScheduleService,
];

let h: Harness;
const secrets = {} as Record<TokenRoleName, string>;
beforeAll(async () => {
  h = await createHarness({ auth: "on" });
  for (const role of ["admin", "client", "worker"] as const) secrets[role] = await h.token(role);
});
afterAll(() => h.close());

/** Calls `method` with an empty request through a client presenting `token`; its code. */
async function codeOf(
  service: DescService,
  method: DescMethod,
  token: string,
): Promise<Code | "ok"> {
  const client = h.as(service, token) as unknown as Record<string, (...a: unknown[]) => unknown>;
  const call = client[method.localName] as (...a: unknown[]) => unknown;
  const signal = AbortSignal.timeout(5000);
  try {
    switch (method.methodKind) {
      case "unary":
        await call({}, { signal });
        break;
      case "server_streaming":
        for await (const _ of call({}, { signal }) as AsyncIterable<unknown>) break;
        break;
      case "client_streaming":
        await call(
          (async function* () {
            yield {};
          })(),
          { signal },
        );
        break;
      case "bidi_streaming":
        for await (const _ of call(
          (async function* () {
            yield {};
          })(),
          { signal },
        ) as AsyncIterable<unknown>)
          break;
        break;
    }
    return "ok";
  } catch (error) {
    return ConnectError.from(error).code;
  }
}

describe("authentication", () => {
  it("refuses a call without a token, with a malformed header, and with an unknown token alike", async () => {
    const calls = [
      h.tasks.listTasks({}),
      h.as(TaskService, "").listTasks({}),
      h.as(TaskService, "not a token at all!").listTasks({}),
      h.as(TaskService, `mw_${"A".repeat(43)}`).listTasks({}),
    ];
    for (const call of calls) {
      expect(await outcome(call)).toMatchObject({
        code: "Unauthenticated",
        reason: "UNAUTHENTICATED",
      });
    }
  });

  it("refuses a revoked token with the same answer as an unknown one, within the cache time", async () => {
    const secret = await h.token("client", "soon-revoked");
    expect((await outcome(h.as(TaskService, secret).listTasks({}))).code).toBe("ok");
    const admin = h.as(TokenService, secrets.admin);
    await admin.revokeToken({ name: "soon-revoked" });
    await new Promise((r) => setTimeout(r, 600)); // the guard trusts a lookup for 500 ms
    const revoked = await outcome(h.as(TaskService, secret).listTasks({}));
    const unknown = await outcome(h.as(TaskService, `mw_${"B".repeat(43)}`).listTasks({}));
    expect(revoked).toEqual(unknown);
    expect(revoked.code).toBe("Unauthenticated");
  });
});

describe("open services", () => {
  it("answers health without a token, and reflection only with one", async () => {
    const health = await outcome(h.as(Health, "").check({}));
    expect(health.code).toBe("ok");
    const list = (token: string) =>
      outcome(
        (async () => {
          const reflection = h.as(ServerReflection, token);
          for await (const _ of reflection.serverReflectionInfo(
            (async function* () {
              yield { messageRequest: { case: "listServices" as const, value: "" } };
            })(),
          ))
            break;
        })(),
      );
    expect((await list("")).code).toBe("Unauthenticated");
    expect((await list(secrets.worker)).code).toBe("ok");
  });
});

describe("roles", () => {
  it("has a rule for every RPC it serves", () => {
    for (const s of services) {
      for (const m of s.methods) expect(policy[`${s.typeName}/${m.name}`], m.name).toBeDefined();
    }
  });

  for (const role of ["admin", "client", "worker"] as const) {
    it(`lets ${role === "admin" ? "an" : "a"} ${role} token call exactly what its rule allows`, async () => {
      for (const s of services) {
        for (const m of s.methods) {
          const rule = policy[`${s.typeName}/${m.name}`];
          const allowed = role === "admin" || (rule?.roles.includes(role) ?? false);
          const code = await codeOf(s, m, secrets[role]);
          if (allowed) {
            expect(
              [Code.PermissionDenied, Code.Unauthenticated],
              `${role} ${m.name}`,
            ).not.toContain(code);
          } else {
            expect(code, `${role} ${m.name}`).toBe(Code.PermissionDenied);
          }
        }
      }
    });
  }

  it("gives each role what the roles promise: clients tasks and knowledge, workers their work, admin tokens", async () => {
    const expectations: [TokenRoleName, DescService, string, boolean][] = [
      ["client", TaskService, "CreateTask", true],
      ["client", TaskService, "ScheduleTask", true],
      ["client", KnowledgeService, "ImportKnowledge", true],
      ["client", ArtifactService, "DownloadArtifact", true],
      ["client", LeaseService, "ClaimTasks", false],
      ["client", LeaseService, "CompleteTask", false],
      ["client", FleetService, "RegisterWorker", false],
      ["client", TokenService, "CreateToken", false],
      ["worker", FleetService, "RegisterWorker", true],
      ["worker", LeaseService, "ClaimTasks", true],
      ["worker", LeaseService, "StreamLeases", true],
      ["worker", ArtifactService, "DownloadArtifact", true],
      ["worker", TaskService, "CreateTask", false],
      ["worker", TaskService, "CancelTask", false],
      ["worker", KnowledgeService, "GetEntry", false],
      ["worker", TokenService, "ListTokens", false],
      ["admin", TokenService, "RevokeToken", true],
      ["admin", LeaseService, "ClaimTasks", true],
      ["client", ShareService, "ListShares", true],
      ["client", ShareService, "SetShare", false],
      ["client", ConcurrencyService, "SetLimit", false],
      ["worker", ConcurrencyService, "ListRates", false],
      ["client", ScheduleService, "CreateSchedule", true],
      ["client", ScheduleService, "TriggerSchedule", true],
      ["client", ScheduleService, "ListSchedules", true],
      ["worker", ScheduleService, "CreateSchedule", false],
      ["worker", ScheduleService, "GetSchedule", false],
      ["worker", ScheduleService, "DeleteSchedule", false],
    ];
    for (const [role, service, name, allowed] of expectations) {
      const method = service.methods.find((m) => m.name === name);
      if (!method) throw new Error(`no method ${name}`);
      const code = await codeOf(service, method, secrets[role]);
      expect(code === Code.PermissionDenied, `${role} ${name}`).toBe(!allowed);
    }
  });

  it("lets a client upload an input but not a task's artifact, and a worker the reverse", async () => {
    const header = (taskId: string) => ({
      payload: {
        case: "header" as const,
        value: { taskId, workerId: taskId, attempt: 1, filename: "x", contentType: "" },
      },
    });
    const upload = (token: string, taskId: string) =>
      outcome(
        h.as(ArtifactService, token).uploadArtifact(
          (async function* () {
            yield header(taskId);
          })(),
        ),
      );
    const someTask = "00000000-0000-4000-8000-000000000001";
    expect((await upload(secrets.client, "")).code).toBe("ok");
    expect((await upload(secrets.client, someTask)).code).toBe("PermissionDenied");
    expect((await upload(secrets.worker, "")).code).toBe("PermissionDenied");
    expect((await upload(secrets.worker, someTask)).code).toBe("NotFound");
  });
});

describe("a worker token acts only for its own workers", () => {
  it("refuses every worker call naming another token's worker, leaving the lease as it was", async () => {
    const workload = uniqueWorkload();
    const mine = await h.token("worker");
    const theirs = await h.token("worker");
    const fleet = h.as(FleetService, mine);
    const leases = h.as(LeaseService, mine);
    const { workerId } = await fleet.registerWorker({
      capabilities: [workload],
      maxConcurrency: 5,
    });
    await h.as(TaskService, secrets.client).createTasks({ tasks: [{ workload }, { workload }] });
    const [claim] = (await leases.claimTasks({ workerId })).claims;
    if (!claim) throw new Error("nothing claimed");
    const lease = { taskId: claim.taskId, workerId, attempt: 1, leaseToken: claim.leaseToken };
    // The same lease named by its token alone (LeaseService): the holder it
    // names is not theirs either.
    const byToken = { taskId: claim.taskId, leaseToken: claim.leaseToken };
    const before = await h.tasks.getTask({ taskId: claim.taskId }).catch(() => undefined);
    expect(before).toBeUndefined(); // the default client has no token

    const f = h.as(FleetService, theirs);
    const l = h.as(LeaseService, theirs);
    const a = h.as(ArtifactService, theirs);
    const refusals = [
      () => f.registerWorker({ workerId, capabilities: ["stolen"] }),
      () => f.heartbeat({ workerId }),
      () => f.drainWorker({ workerId, drained: true }),
      () => f.deregisterWorker({ workerId }),
      () => l.claimTasks({ workerId }),
      () => l.startTask(lease),
      () => l.renewLease(lease),
      () => l.completeTask(lease),
      () => l.completeTasks({ completions: [lease] }),
      () => l.failTask({ ...lease, errorCode: "X" }),
      () => l.releaseTask(lease),
      () => l.startTask(byToken),
      () => l.renewLease(byToken),
      () => l.completeTask(byToken),
      () => l.failTask({ ...byToken, errorCode: "X" }),
      () => l.releaseTask(byToken),
      () =>
        (async () => {
          for await (const _ of l.streamLeases(
            (async function* () {
              yield { workerId, leases: [lease] };
            })(),
          ))
            break;
        })(),
      () =>
        a.uploadArtifact(
          (async function* () {
            yield {
              payload: {
                case: "header" as const,
                value: { ...lease, filename: "out.txt", contentType: "text/plain" },
              },
            };
            yield { payload: { case: "chunk" as const, value: new TextEncoder().encode("x") } };
          })(),
        ),
    ];
    for (const call of refusals) {
      expect(await outcome(call())).toMatchObject({
        code: "PermissionDenied",
        reason: "FOREIGN_WORKER_TOKEN",
      });
    }
    const admin = h.as(TaskService, secrets.admin);
    const { task } = await admin.getTask({ taskId: claim.taskId });
    expect(task).toMatchObject({ state: TaskState.RUNNING, attempt: 1, lease: { workerId } });
    const worker = await h.as(FleetService, secrets.admin).getWorker({ workerId });
    expect(worker.worker).toMatchObject({ capabilities: [workload], drained: false });
    // The owner itself still can.
    expect((await leases.completeTask(lease)).task?.state).toBe(TaskState.SUCCEEDED);
  });
});

describe("a worker id that is not a UUID", () => {
  it("is invalid_argument for a worker token, as for any other, not an unexpected error", async () => {
    const worker = h.as(FleetService, secrets.worker);
    const leases = h.as(LeaseService, secrets.worker);
    for (const workerId of ["abc", "../x", "00000000-0000-4000-8000-00000000000g"]) {
      // The ownership check runs first: it must not send the id to a uuid column.
      expect(await outcome(worker.heartbeat({ workerId }))).toMatchObject({
        code: "InvalidArgument",
      });
      expect(await outcome(leases.claimTasks({ workerId }))).toMatchObject({
        code: "InvalidArgument",
      });
    }
  });
});

describe("tokens", () => {
  it("shows a secret once, never in a listing, and refuses a duplicate name or no role", async () => {
    const tokens = h.as(TokenService, secrets.admin);
    const made = await tokens.createToken({ name: "listed", role: TokenRole.CLIENT });
    expect(made.secret).toMatch(/^mw_[A-Za-z0-9_-]{43}$/);
    const { tokens: all } = await tokens.listTokens({});
    expect(JSON.stringify(all, (_k, v) => (typeof v === "bigint" ? `${v}` : v))).not.toContain(
      made.secret,
    );
    expect(all.find((t) => t.name === "listed")).toMatchObject({ role: TokenRole.CLIENT });
    expect(
      (await outcome(tokens.createToken({ name: "listed", role: TokenRole.CLIENT }))).code,
    ).toBe("AlreadyExists");
    expect((await outcome(tokens.createToken({ name: "x" }))).code).toBe("InvalidArgument");
    expect(
      (await outcome(tokens.createToken({ name: "bad name", role: TokenRole.CLIENT }))).code,
    ).toBe("InvalidArgument");
    expect((await outcome(tokens.revokeToken({ name: "no-such-token" }))).code).toBe("NotFound");
  });
});

describe("rate limit", () => {
  it("answers resource_exhausted with a retry hint past the burst; admin is not limited", async () => {
    const limited = await createHarness({ auth: "on", rateLimit: 1, rateBurst: 2 });
    try {
      const client = await limited.token("client");
      const admin = await limited.token("admin");
      const tasks = limited.as(TaskService, client);
      expect((await outcome(tasks.listTasks({}))).code).toBe("ok");
      expect((await outcome(tasks.listTasks({}))).code).toBe("ok");
      const over = await tasks.listTasks({}).catch((e: unknown) => ConnectError.from(e));
      expect(over).toBeInstanceOf(ConnectError);
      expect((over as ConnectError).code).toBe(Code.ResourceExhausted);
      expect(Number((over as ConnectError).metadata.get("retry-after"))).toBeGreaterThanOrEqual(1);
      for (let i = 0; i < 5; i++) {
        expect((await outcome(limited.as(TaskService, admin).listTasks({}))).code).toBe("ok");
      }
    } finally {
      await limited.close();
    }
  });
});
