import { readFileSync } from "node:fs";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ExternalScaler } from "../../gen/externalscaler/externalscaler_pb.js";
import { Operator } from "../../gen/meshwork/v1/task_pb.js";
import { type KedaListener, listenKeda } from "../../src/http/keda-listener.js";
import { kedaHandler } from "../../src/server.js";
import { within } from "../support/bounded.js";
import { outcome } from "../support/errors.js";
import { createHarness, type Harness, uniqueWorkload } from "../support/harness.js";
import { clientCertificate, selfSignedCert } from "../support/tls.js";

// KEDA's external scaler on its own listener, called as KEDA calls it:
// gRPC over HTTP/2 through a client generated from proto/externalscaler.

let h: Harness;
beforeAll(async () => {
  h = await createHarness();
});
afterAll(() => h.close());

describe("the KEDA external scaler over h2c", () => {
  let keda: KedaListener;
  let scaler: ReturnType<typeof createClient<typeof ExternalScaler>>;
  beforeAll(async () => {
    keda = await listenKeda(kedaHandler(h.app), {
      listen: "127.0.0.1:0",
      tlsCert: "",
      tlsKey: "",
      clientCa: "",
    });
    scaler = createClient(ExternalScaler, createGrpcTransport({ baseUrl: keda.url }));
  });
  afterAll(() => keda.close());

  it("answers a pool's demand in workers of its capacity, by resources, and the backlog's age", async () => {
    const workload = uniqueWorkload("render");
    const ref = {
      name: "renderers",
      namespace: "farm",
      scalerMetadata: {
        workload,
        selector: "zone=eu,gpu in (a100|h100)",
        workerCapacity: "gpu=4,cpu=16000",
      },
    };
    expect((await scaler.isActive(ref)).result).toBe(false);
    expect((await scaler.getMetricSpec(ref)).metricSpecs).toMatchObject([
      { metricName: "meshwork_workers_needed", targetSize: 1n, targetSizeFloat: 1 },
    ]);
    // 9 tasks of 1 GPU and 2 of 3 GPUs: 15 GPUs, 4 workers of 4 GPUs.
    await h.tasks.createTasks({
      tasks: [
        ...Array.from({ length: 9 }, () => ({ workload, resources: { gpu: 1n, cpu: 1000n } })),
        ...Array.from({ length: 2 }, () => ({ workload, resources: { gpu: 3n } })),
        // Not the pool's: another zone, one no worker of 4 GPUs can hold, and
        // one asking a resource the pool's workers do not offer at all.
        { workload, affinity: { zone: "us" }, resources: { gpu: 1n } },
        { workload, resources: { gpu: 8n } },
        { workload, resources: { gpu: 1n, "license/x": 1n } },
        // One that requires a GPU label no worker of the pool carries, and
        // one that may not start for an hour (each would need a fifth worker).
        {
          workload,
          requirements: [{ key: "gpu", operator: Operator.IN, values: ["v100"] }],
          resources: { gpu: 2n },
        },
        { workload, start: { case: "delay", value: { seconds: 3600n } }, resources: { gpu: 2n } },
      ],
    });
    expect((await scaler.isActive(ref)).result).toBe(true);
    const metric = async (metricName: string) =>
      (await scaler.getMetrics({ scaledObjectRef: ref, metricName })).metricValues[0];
    expect(await metric("meshwork_workers_needed")).toMatchObject({
      metricValue: 4n,
      metricValueFloat: 4,
    });
    const age = await metric("s0-meshwork_backlog_age_seconds");
    expect(age?.metricName).toBe("s0-meshwork_backlog_age_seconds");
    expect(age?.metricValueFloat).toBeGreaterThanOrEqual(0);
    // A pool worker takes work: what it runs still counts, on its workers.
    const { workerId } = await h.fleet.registerWorker({
      capabilities: [workload],
      labels: { zone: "eu", gpu: "a100" },
      maxConcurrency: 8,
      capacity: { gpu: 4n, cpu: 16_000n },
    });
    expect((await h.leases.claimTasks({ workerId, maxTasks: 8 })).claims.length).toBe(4);
    expect((await metric("meshwork_workers_needed"))?.metricValue).toBe(4n);
    // The same figures in GetFleetStatus, against the largest worker that offers the workload.
    const status = await h.fleet.getFleetStatus({});
    const backlog = status.backlog.find((b) => b.workload === workload);
    expect(backlog?.workerCapacity).toMatchObject({ gpu: 4n, cpu: 16_000n });
    expect(backlog?.pendingResources.gpu).toBe(5n + 2n * 3n + 1n + 8n + 1n + 2n + 2n);
    // The same 15 GPUs (what the worker runs included), in 4 workers.
    expect(backlog?.workersNeeded).toBe(4);
    expect(await h.app.metrics.scrape()).toContain(
      `meshwork_workers_needed{workload="${workload}"} 4`,
    );
  });

  it("refuses a trigger without a workload or with a selector it cannot read", async () => {
    const bad: Record<string, string>[] = [
      {},
      { workload: "w", selector: "zone" },
      { workload: "w", workerCapacity: "gpu=lots" },
    ];
    for (const scalerMetadata of bad) {
      expect((await outcome(scaler.isActive({ scalerMetadata }))).code).toBe("InvalidArgument");
    }
  });

  it("streams IsActive now and when it changes", async () => {
    const workload = uniqueWorkload("stream");
    const controller = new AbortController();
    const stream = scaler
      .streamIsActive({ scalerMetadata: { workload } }, { signal: controller.signal })
      [Symbol.asyncIterator]();
    try {
      const first = await within(15_000, stream.next());
      expect(first === "timed out" ? first : first.value?.result).toBe(false);
      await h.tasks.createTask({ workload });
      const second = await within(15_000, stream.next());
      expect(second === "timed out" ? second : second.value?.result).toBe(true);
    } finally {
      controller.abort();
    }
  });
});

describe("the KEDA listener with --keda-client-ca", () => {
  it("serves a client that presents a certificate of the CA, and no other", async () => {
    const server = selfSignedCert("keda-server-");
    const client = clientCertificate("keda-client-");
    const stranger = clientCertificate("keda-stranger-");
    const keda = await listenKeda(kedaHandler(h.app), {
      listen: "127.0.0.1:0",
      tlsCert: server.cert,
      tlsKey: server.key,
      clientCa: client.cert,
    });
    try {
      const as = (cert?: { cert: string; key: string }) =>
        createClient(
          ExternalScaler,
          createGrpcTransport({
            baseUrl: keda.url,
            nodeOptions: {
              ca: readFileSync(server.cert),
              ...(cert && { cert: readFileSync(cert.cert), key: readFileSync(cert.key) }),
            },
          }),
        );
      const ref = { scalerMetadata: { workload: uniqueWorkload() } };
      expect((await as(client).isActive(ref)).result).toBe(false);
      expect((await outcome(as().isActive(ref))).code).not.toBe("ok");
      expect((await outcome(as(stranger).isActive(ref))).code).not.toBe("ok");
    } finally {
      await keda.close();
    }
  });
});
