import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { TokenRole, TokenService } from "../../gen/meshwork/v1/token_pb.js";
import { useListeningServer } from "../support/server.js";

// One request a second per token, three at once.
const server = useListeningServer({ auth: "on", rateLimit: 1, rateBurst: 3 });

async function workerToken(): Promise<string> {
  const tokens = createClient(
    TokenService,
    createConnectTransport({
      baseUrl: server.url,
      httpVersion: "1.1",
      interceptors: [
        (next) => (req) => {
          req.header.set("authorization", `Bearer ${server.adminToken}`);
          return next(req);
        },
      ],
    }),
  );
  const { secret } = await tokens.createToken({ name: "rest-limits", role: TokenRole.WORKER });
  return secret;
}

describe("REST routes and the per-token rate limit", () => {
  it("counts a REST request once, however many RPCs it makes inside", async () => {
    const token = await workerToken();
    const post = (path: string, body: unknown) =>
      fetch(`${server.url}${path}`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}` },
        body: JSON.stringify(body),
      });
    // Three requests fit the burst (a peer registration makes two RPCs when it drains).
    const registered = await post("/api/mesh/fleet/nodes", {
      peerId: "limits-1",
      drained: true,
    });
    expect(registered.status).toBe(200);
    const { workerId } = (await registered.json()) as { workerId: string };
    expect((await post("/tasks/claim", { worker_id: workerId })).status).toBe(204);
    expect((await post("/tasks/claim", { worker_id: workerId })).status).toBe(204);
    const refused = await post("/tasks/claim", { worker_id: workerId });
    expect(refused.status).toBe(429);
    expect(refused.headers.get("retry-after")).toMatch(/^\d+$/);
    expect(await refused.json()).toMatchObject({
      error: "resource_exhausted",
      reason: "RATE_LIMITED",
    });
  });
});

describe("X-Ashlar-Correlation-Id", () => {
  it("is echoed on every /api/mesh answer, refusals at the door included", async () => {
    const refused = await fetch(`${server.url}/api/mesh/tasks`, {
      headers: { "x-ashlar-correlation-id": "door-1" },
    });
    expect(refused.status).toBe(401);
    expect(refused.headers.get("x-ashlar-correlation-id")).toBe("door-1");
    const unknown = await fetch(`${server.url}/api/mesh/nope`);
    expect(unknown.status).toBe(404);
    expect(unknown.headers.get("x-ashlar-correlation-id")).toMatch(/^[0-9a-f-]{36}$/);
  });
});
