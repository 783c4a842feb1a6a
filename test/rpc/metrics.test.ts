import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { outcome } from "../support/errors.js";
import {
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
afterAll(async () => {
  await h.close();
});

/** meshwork_rpc_requests_total of TaskService/WatchTask with `code`, as the app's registry holds it. */
async function watchCount(code: string): Promise<number> {
  const metric = await h.app.metrics.rpcRequests.get();
  return metric.values
    .filter((v) => v.labels.method === "WatchTask" && v.labels.code === code)
    .reduce((total, v) => total + v.value, 0);
}

describe("RPC metrics of streams", () => {
  it("counts a stream once, when it ends: ok or refused", async () => {
    const workload = uniqueWorkload();
    const workerId = await registerWorker(h, [workload]);

    // To its end: the task finishes.
    const { task } = await h.tasks.createTask({ workload });
    const taskId = task?.taskId ?? "";
    let messages = 0;
    for await (const res of h.tasks.watchTask({ taskId })) {
      messages++;
      expect(await watchCount("ok")).toBe(0);
      if (res.task?.state === TaskState.PENDING) {
        const claim = await claimOne(h, workerId);
        await h.leases.completeTask({ taskId: claim.taskId, workerId, attempt: claim.attempt });
      }
    }
    expect(messages).toBeGreaterThan(1);
    expect(await watchCount("ok")).toBe(1);

    // Refused: the error surfaces while the stream is read.
    expect(
      (
        await outcome(
          (async () => {
            for await (const _ of h.tasks.watchTask({ taskId: "nope" })) {
            }
          })(),
        )
      ).code,
    ).toBe("InvalidArgument");
    expect(await watchCount("invalid_argument")).toBe(1);
  });
});
