import { randomUUID } from "node:crypto";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { DescService } from "@bufbuild/protobuf";
import {
  type Client,
  createClient,
  createRouterTransport,
  type Transport,
} from "@connectrpc/connect";
import { pino } from "pino";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { type Claim, LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import { type App, createApp } from "../../src/app.js";
import * as s3 from "../../src/artifacts/blob-s3.js";
import type { Config } from "../../src/config.js";
import type { Database } from "../../src/db/database.js";
import type { TokenRoleName } from "../../src/db/schema/index.js";
import { createRoutes, rpcInterceptors } from "../../src/server.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "./database.js";

/**
 * The blob store of test apps: the file store, or with
 * `MESHWORK_TEST_BLOB_STORE=postgres` (and DATABASE_URL) the PostgreSQL one,
 * to run the whole suite on it.
 */
export const testBlobStore: Config["blobStore"] =
  process.env.MESHWORK_TEST_BLOB_STORE === "postgres" && onPostgres
    ? { kind: "postgres" }
    : { kind: "fs" };

export function testConfig(overrides: Partial<Config> = {}): Config {
  return {
    listen: "127.0.0.1:0",
    dataDir: "memory://",
    databaseUrl: "",
    dbPoolSize: 10,
    dbAcquireTimeoutMs: 3000,
    dbStatementTimeoutMs: 30_000,
    publicUrl: "http://127.0.0.1:8080",
    auth: "off",
    blobDir: mkdtempSync(join(tmpdir(), "meshwork-blobs-")),
    blobStore: testBlobStore,
    logLevel: "silent",
    logFormat: "json",
    metricsPublic: false,
    // Vacuums would come at random points of tests; the upkeep's own tests turn it on.
    vacuum: false,
    otelEndpoint: "",
    heartbeatIntervalSeconds: 15,
    retentionMs: 0,
    workerRetentionMs: 0,
    sweepIntervalMs: 1000,
    shutdownGraceMs: 2000,
    readMaxBytes: 4 * 1024 * 1024,
    maxArtifactBytes: 1 << 30,
    tlsCert: "",
    tlsKey: "",
    rateLimit: 0,
    rateBurst: 1,
    rateLimitAdmin: false,
    maxTimeoutMs: 300_000,
    headersTimeoutMs: 10_000,
    requestTimeoutMs: 600_000,
    idleTimeoutMs: 300_000,
    maxConcurrentStreams: 1000,
    maxHeaderBytes: 16_384,
    maxConnectionsPerSource: 256,
    bodyTimeoutMs: 30_000,
    // Tests send many refused requests from one address on purpose; the
    // throttle's own tests turn it on.
    authFailureRate: 0,
    authFailureBurst: 1,
    maxPendingAuthBytes: 64 * 1024 * 1024,
    defaultShare: "",
    shareHalfLifeMs: 300_000,
    // Reservations are tested on purpose; elsewhere they would only add a look per claim.
    reserveAfterMs: 0,
    kedaListen: "",
    kedaClientCa: "",
    logLinesPerTask: 10_000,
    logLinesPerSecond: 1000,
    dispatchDefault: false,
    dispatchWorkloads: [],
    dispatchTimeoutMs: 10_000,
    dispatchConcurrency: 16,
    dispatchAllow: ["127.0.0.0/8", "::1/128"],
    ...overrides,
  };
}

export interface Harness {
  db: TestDatabase;
  app: App;
  fleet: Client<typeof FleetService>;
  tasks: Client<typeof TaskService>;
  leases: Client<typeof LeaseService>;
  /** The in-memory transport of the default clients (no token), for other services. */
  transport: Transport;
  /** A client of `service` that presents `token` (for auth tests; the default clients send none). */
  as<S extends DescService>(service: S, token: string): Client<S>;
  /** Makes a token of `role` and returns its secret. */
  token(role: TokenRoleName, name?: string): Promise<string>;
  close(): Promise<void>;
}

/**
 * An app on a fresh database with clients that go through the real handlers
 * and interceptors (in memory, no socket). The sweeper does not run on its
 * own: tests call `app.sweeper.runOnce()`.
 */
export async function createHarness(overrides: Partial<Config> = {}): Promise<Harness> {
  const db = await createTestDatabase();
  const app = appOn(db.database, overrides);
  await app.start({ sweeper: false });
  const transport = createRouterTransport(createRoutes(app), {
    router: { interceptors: rpcInterceptors(app) },
  });
  const routes = createRoutes(app);
  return {
    db,
    app,
    fleet: createClient(FleetService, transport),
    tasks: createClient(TaskService, transport),
    leases: createClient(LeaseService, transport),
    transport,
    as(service, token) {
      return createClient(
        service,
        createRouterTransport(routes, {
          router: { interceptors: rpcInterceptors(app) },
          transport: {
            interceptors: [
              (next) => (req) => {
                req.header.set("authorization", `Bearer ${token}`);
                return next(req);
              },
            ],
          },
        }),
      );
    },
    async token(role, name = `${role}-${randomUUID().slice(0, 8)}`) {
      return (await app.tokens.create(name, role)).secret;
    },
    async close() {
      await app.stop();
      await db.drop();
    },
  };
}

export function appOn(database: Database, overrides: Partial<Config> = {}): App {
  // Tests load blob-s3.ts up front; `serve` loads it only for an S3 store.
  return createApp(database, testConfig(overrides), pino({ level: "silent" }), s3);
}

/** A workload name no other test uses, so tests sharing a database never claim each other's tasks. */
export function uniqueWorkload(prefix = "work"): string {
  return `${prefix}-${randomUUID().slice(0, 8)}`;
}

/** Registers a worker for `workload` and returns its id. */
export async function registerWorker(
  h: Pick<Harness, "fleet">,
  capabilities: string[],
  extra: { labels?: Record<string, string>; name?: string; maxConcurrency?: number } = {},
): Promise<string> {
  const res = await h.fleet.registerWorker({
    maxConcurrency: extra.maxConcurrency ?? 100,
    name: extra.name ?? "worker",
    capabilities,
    labels: extra.labels ?? {},
  });
  return res.workerId;
}

/** Claims one task for `workerId` (ClaimTasks, no wait); throws when there is nothing to claim. */
export async function claimOne(h: Pick<Harness, "leases">, workerId: string): Promise<Claim> {
  const { claims } = await h.leases.claimTasks({ workerId, maxTasks: 1 });
  const [claim] = claims;
  if (!claim) throw new Error("nothing claimed");
  return claim;
}
