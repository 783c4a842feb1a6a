import { fromBinary, fromJson, toBinary, toJson } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { ClaimSchema } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskSchema } from "../../gen/meshwork/v1/task_pb.js";
import type { DeliveryRow, TaskRow } from "../../src/db/schema/index.js";
import { toClaim } from "../../src/leases/convert.js";
import { toTask } from "../../src/tasks/convert.js";

// toTask and toClaim build their messages as object literals instead of
// through create(): these check that what they build is a well-formed
// message (every field survives the wire, binary and JSON) and that each
// part reads as a client sees it.

const created = new Date("2026-12-07T10:00:00.123Z");

/** A task as CreateTask leaves it: nothing optional set. */
const fresh: TaskRow = {
  id: "01a24fe2-b280-7777-bdcc-11b809b2ce92",
  name: "",
  workload: "render",
  requiredCapabilities: [],
  affinity: {},
  priority: 0,
  deadline: null,
  parameters: null,
  input: null,
  steps: null,
  state: "PENDING",
  attempt: 0,
  releases: 0,
  failures: 0,
  maxAttempts: 3,
  leaseSeconds: 60,
  backoffInitialMs: 1000,
  backoffMaxMs: 300_000,
  backoffMultiplier: 2,
  idempotencyKey: null,
  requestHash: null,
  correlationId: "",
  traceParent: "",
  traceState: "",
  assignedWorkerId: null,
  assignedApiBaseUrl: "",
  scheduleIdempotencyKey: null,
  leaseWorkerId: null,
  leaseToken: null,
  leaseExpiresAt: null,
  checkpointHandle: "",
  progressSteps: 0,
  progressMessage: "",
  result: null,
  resultSummary: "",
  metrics: {},
  completionHash: null,
  errorCode: "",
  errorMessage: "",
  cancelRequested: false,
  notBefore: null,
  createdAt: created,
  updatedAt: created,
  startedAt: null,
  finishedAt: null,
  resources: { slots: 1 },
  requirements: [],
  preferences: [],
  share: "default",
  concurrencyKey: "",
  rateKey: "",
  runAt: null,
  ref: "",
  dependsOn: [],
  dependencyPolicy: "ALL_SUCCEEDED",
  dependenciesPending: 0,
  timeoutSeconds: null,
  attemptDeadline: null,
  resultValue: null,
  scheduleId: null,
  dispatch: false,
};

const ref = (id: string) => ({
  artifactId: id,
  uri: `http://127.0.0.1:8080/v1/artifacts/${id}`,
  sha256: "ab".repeat(32),
  sizeBytes: 12,
  contentType: "text/plain",
});

/** A task with every part that can be set, held by a worker. */
const full: TaskRow = {
  ...fresh,
  name: "frame-7",
  requiredCapabilities: ["gpu"],
  affinity: { zone: "a" },
  priority: -3,
  deadline: new Date("2026-12-08T00:00:00.5Z"),
  parameters: { frame: 7, tags: ["a"] },
  input: ref("01a24fe2-b280-7777-bdcc-000000000001"),
  steps: 10,
  state: "RUNNING",
  attempt: 2,
  backoffInitialMs: 1500,
  backoffMultiplier: 1.5,
  idempotencyKey: "k-1",
  correlationId: "corr",
  traceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
  traceState: "v=1",
  leaseWorkerId: "01a24fe2-b280-7777-bdcc-0000000000aa",
  leaseToken: "secret-token",
  leaseExpiresAt: new Date("2099-01-01T00:00:00Z"),
  checkpointHandle: "ckpt",
  progressSteps: 4,
  progressMessage: "half",
  result: ref("01a24fe2-b280-7777-bdcc-000000000002"),
  resultSummary: "ok",
  metrics: { seconds: 1.25 },
  errorCode: "LEASE_EXPIRED",
  errorMessage: "attempt 1's lease expired",
  cancelRequested: true,
  startedAt: created,
  resources: { slots: 1, gpu: 2 },
  requirements: [{ key: "arch", op: "In", values: ["x86"] }],
  preferences: [{ key: "ssd", op: "Exists", values: [], weight: 5 }],
  share: "team/a",
  concurrencyKey: "c",
  rateKey: "r",
  runAt: created,
  ref: "r1",
  dependsOn: ["01a24fe2-b280-7777-bdcc-000000000003"],
  dependencyPolicy: "ALL_DONE",
  timeoutSeconds: 90,
  resultValue: { answer: 42 },
  scheduleId: "01a24fe2-b280-7777-bdcc-000000000004",
  dispatch: true,
};

const delivery: DeliveryRow = {
  taskId: full.id,
  attempt: 2,
  workerId: "01a24fe2-b280-7777-bdcc-0000000000aa",
  state: "DELIVERING",
  tries: 3,
  lastStatus: 503,
  lastError: "busy",
  lastAt: created,
  nextAt: new Date("2026-12-07T10:00:05Z"),
  claimedUntil: null,
};

describe("tasks and claims as messages", () => {
  it("a task of every shape survives the binary and JSON wire as it was built", () => {
    for (const task of [
      toTask(fresh),
      toTask(full),
      toTask(full, true, { dep: "out" }, delivery),
      toTask({ ...full, notBefore: new Date(Number.POSITIVE_INFINITY) }),
    ]) {
      expect(fromBinary(TaskSchema, toBinary(TaskSchema, task))).toEqual(task);
      expect(fromJson(TaskSchema, toJson(TaskSchema, task))).toEqual(task);
    }
  });

  it("a new task reads with its defaults and no optional part", () => {
    expect(toJson(TaskSchema, toTask(fresh))).toEqual({
      taskId: fresh.id,
      workload: "render",
      state: "TASK_STATE_PENDING",
      maxAttempts: 3,
      leaseSeconds: 60,
      retryBackoff: { initial: "1s", max: "300s", multiplier: 2 },
      progress: {},
      createdAt: "2026-12-07T10:00:00.123Z",
      updatedAt: "2026-12-07T10:00:00.123Z",
      resources: { slots: "1" },
      share: "default",
      dependencyPolicy: "DEPENDENCY_POLICY_ALL_SUCCEEDED",
    });
  });

  it("every part of a held task reads as stored, the token only where the lease is granted", () => {
    const json = toJson(TaskSchema, toTask(full, true, { dep: "out" }, delivery)) as Record<
      string,
      unknown
    >;
    expect(json).toMatchObject({
      name: "frame-7",
      requiredCapabilities: ["gpu"],
      affinity: { zone: "a" },
      priority: -3,
      deadline: "2026-12-08T00:00:00.500Z",
      parameters: { frame: 7, tags: ["a"] },
      input: { ...ref("01a24fe2-b280-7777-bdcc-000000000001"), sizeBytes: "12" },
      steps: 10,
      state: "TASK_STATE_RUNNING",
      attempt: 2,
      retryBackoff: { initial: "1.500s", max: "300s", multiplier: 1.5 },
      idempotencyKey: "k-1",
      correlationId: "corr",
      traceparent: full.traceParent,
      tracestate: "v=1",
      lease: {
        workerId: full.leaseWorkerId,
        attempt: 2,
        leaseToken: "secret-token",
        expiresAt: "2099-01-01T00:00:00Z",
      },
      checkpointHandle: "ckpt",
      progress: { completedSteps: 4, message: "half" },
      result: { artifactId: "01a24fe2-b280-7777-bdcc-000000000002", sizeBytes: "12" },
      resultSummary: "ok",
      metrics: { seconds: 1.25 },
      error: { code: "LEASE_EXPIRED", message: "attempt 1's lease expired" },
      cancelRequested: true,
      startedAt: "2026-12-07T10:00:00.123Z",
      resources: { slots: "1", gpu: "2" },
      requirements: [{ key: "arch", operator: "OPERATOR_IN", values: ["x86"] }],
      preferences: [{ weight: 5, requirement: { key: "ssd", operator: "OPERATOR_EXISTS" } }],
      share: "team/a",
      concurrencyKey: "c",
      rateKey: "r",
      ref: "r1",
      dependsOn: full.dependsOn,
      dependencyPolicy: "DEPENDENCY_POLICY_ALL_DONE",
      dependencyOutputs: { dep: "out" },
      timeoutSeconds: 90,
      resultValue: { answer: 42 },
      runAt: "2026-12-07T10:00:00.123Z",
      scheduleId: full.scheduleId,
      dispatch: true,
      delivery: {
        state: "DELIVERY_STATE_DELIVERING",
        workerId: delivery.workerId,
        attempt: 2,
        tries: 3,
        lastStatus: 503,
        lastError: "busy",
        lastAt: "2026-12-07T10:00:00.123Z",
        nextAt: "2026-12-07T10:00:05Z",
      },
    });
    // A live lease has not ended; a read never shows the token.
    expect(json.lease).not.toHaveProperty("endedAt");
    expect(toTask(full).lease?.leaseToken).toBe("");
  });

  it("a pushed task that finished reads with its assignment, its ended lease and no backoff", () => {
    const finished = new Date("2026-12-07T10:05:00Z");
    const task = toTask(
      {
        ...fresh,
        state: "SUCCEEDED",
        attempt: 1,
        backoffInitialMs: 0,
        backoffMaxMs: 0,
        assignedWorkerId: "01a24fe2-b280-7777-bdcc-0000000000bb",
        assignedApiBaseUrl: "http://10.0.0.7:9000",
        leaseWorkerId: "01a24fe2-b280-7777-bdcc-0000000000bb",
        leaseToken: "secret-token",
        leaseExpiresAt: new Date("2026-12-07T10:06:00Z"),
        dependenciesPending: 2,
        finishedAt: finished,
        updatedAt: finished,
      },
      false,
      {},
      { ...delivery, state: "ACCEPTED" },
    );
    expect(fromBinary(TaskSchema, toBinary(TaskSchema, task))).toEqual(task);
    expect(toJson(TaskSchema, task)).toMatchObject({
      state: "TASK_STATE_SUCCEEDED",
      retryBackoff: { initial: "0s", max: "0s", multiplier: 2 },
      assignedWorkerId: "01a24fe2-b280-7777-bdcc-0000000000bb",
      assignedApiBaseUrl: "http://10.0.0.7:9000",
      // Ended when it finished, before its expiry; no token in a read.
      lease: { attempt: 1, expiresAt: "2026-12-07T10:06:00Z", endedAt: "2026-12-07T10:05:00Z" },
      dependenciesPending: 2,
      finishedAt: "2026-12-07T10:05:00Z",
      // Only a delivery still being tried says when it tries next.
      delivery: { state: "DELIVERY_STATE_ACCEPTED", tries: 3 },
    });
    expect(task.lease?.leaseToken).toBe("");
    expect(task.delivery?.nextAt).toBeUndefined();
  });

  it("a not_before of 'infinity' (dependencies still waiting) shows no time", () => {
    const waiting = toTask({ ...fresh, notBefore: new Date(Number.POSITIVE_INFINITY) });
    expect(waiting.notBefore).toBeUndefined();
    const later = toTask({ ...fresh, notBefore: new Date("2026-12-07T11:00:00Z") });
    expect(toJson(TaskSchema, later)).toHaveProperty("notBefore", "2026-12-07T11:00:00Z");
  });

  it("a claim survives the wire and carries the lease as granted", () => {
    const claim = toClaim(full, { dep: "out" });
    expect(fromBinary(ClaimSchema, toBinary(ClaimSchema, claim))).toEqual(claim);
    expect(toJson(ClaimSchema, claim)).toEqual({
      taskId: full.id,
      attempt: 2,
      leaseToken: "secret-token",
      leaseExpiresAt: "2099-01-01T00:00:00Z",
      workload: "render",
      input: { ...ref("01a24fe2-b280-7777-bdcc-000000000001"), sizeBytes: "12" },
      parameters: { frame: 7, tags: ["a"] },
      checkpointHandle: "ckpt",
      correlationId: "corr",
      steps: 10,
      name: "frame-7",
      leaseSeconds: 60,
      traceparent: full.traceParent,
      tracestate: "v=1",
      resources: { slots: "1", gpu: "2" },
      dependencyOutputs: { dep: "out" },
      timeoutSeconds: 90,
    });
  });
});
