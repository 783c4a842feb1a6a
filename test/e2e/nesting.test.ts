import type { JsonObject } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import { outcome } from "../support/errors.js";
import { useListeningServer } from "../support/server.js";

/**
 * Deeply nested JSON is refused alike on every surface, by the field's
 * name, at any depth: 48 levels is the most any protocol takes (the most a
 * protobuf client reads back with its library's default limits).
 */
const server = useListeningServer();

/** `{"a":{"a":…1}}`, `depth` objects deep, as text (JSON.stringify would overflow the stack). */
const nested = (depth: number) => `${'{"a":'.repeat(depth)}1${"}".repeat(depth)}`;

describe("nested JSON", () => {
  it("director REST: 48 levels of parameters are taken, 49 and 100,000 are 400 naming parameters", async () => {
    const post = (depth: number) =>
      fetch(`${server.url}/api/mesh/tasks`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: `{"requiredBrickIds":["nest"],"parameters":${nested(depth)}}`,
      });
    expect((await post(48)).status).toBe(200);
    for (const depth of [49, 101, 3000, 100_000]) {
      const res = await post(depth);
      expect(res.status).toBe(400);
      expect(await res.json()).toEqual({
        error: "invalid_argument",
        message: '"parameters" is nested deeper than 48 levels',
      });
    }
  });

  it("gRPC and Connect JSON take 48 levels and refuse 49 by the field's name; a task read back with them decodes", async () => {
    const tasks = createClient(TaskService, createGrpcTransport({ baseUrl: server.url }));
    const value = (depth: number) => JSON.parse(nested(depth)) as JsonObject;
    const { task } = await tasks.createTask({ workload: "nest", parameters: value(48) });
    expect((await tasks.getTask({ taskId: task?.taskId ?? "" })).task?.parameters).toEqual(
      value(48),
    );
    expect(
      await outcome(tasks.createTask({ workload: "nest", parameters: value(49) })),
    ).toMatchObject({
      code: "InvalidArgument",
      message: "parameters is nested deeper than 48 levels",
    });
    const json = await fetch(`${server.url}/meshwork.v1.TaskService/CreateTask`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: `{"workload":"nest","parameters":${nested(49)}}`,
    });
    expect(json.status).toBe(400);
    expect(await json.json()).toMatchObject({
      code: "invalid_argument",
      message: "parameters is nested deeper than 48 levels",
    });
  });
});
