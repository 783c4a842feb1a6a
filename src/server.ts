import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import type * as http from "node:http";
import type * as http2 from "node:http2";
import { createSecureContext } from "node:tls";
import type { ConnectError, ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { ExternalScaler } from "../gen/externalscaler/externalscaler_pb.js";
import { file_grpc_health_v1_health, Health } from "../gen/grpc/health/v1/health_pb.js";
import { ArtifactService, file_meshwork_v1_artifact } from "../gen/meshwork/v1/artifact_pb.js";
import {
  ConcurrencyService,
  file_meshwork_v1_concurrency,
} from "../gen/meshwork/v1/concurrency_pb.js";
import { file_meshwork_v1_errors } from "../gen/meshwork/v1/errors_pb.js";
import { FleetService, file_meshwork_v1_fleet } from "../gen/meshwork/v1/fleet_pb.js";
import { file_meshwork_v1_knowledge, KnowledgeService } from "../gen/meshwork/v1/knowledge_pb.js";
import { file_meshwork_v1_lease, LeaseService } from "../gen/meshwork/v1/lease_pb.js";
import { file_meshwork_v1_schedule, ScheduleService } from "../gen/meshwork/v1/schedule_pb.js";
import { file_meshwork_v1_share, ShareService } from "../gen/meshwork/v1/share_pb.js";
import { file_meshwork_v1_task, TaskService } from "../gen/meshwork/v1/task_pb.js";
import { file_meshwork_v1_token, TokenService } from "../gen/meshwork/v1/token_pb.js";
import type { App } from "./app.js";
import { createArtifactService } from "./artifacts/service.js";
import { openServices } from "./auth/policy.js";
import { kAsker, kPreauthenticated } from "./auth/principal.js";
import { createTokenService } from "./auth/service.js";
import { splitHostPort } from "./config.js";
import { type Correlation, correlationValues } from "./core/context.js";
import { DomainError } from "./core/errors.js";
import { StartupError } from "./data-dir-lock.js";
import { createFleetService } from "./fleet/service.js";
import { closeUnread } from "./http/body-guard.js";
import { byteRoutes } from "./http/bytes.js";
import { createConnectHandler } from "./http/connect-handler.js";
import { createConnectionTrust } from "./http/connection-trust.js";
import { dashboardRoutes } from "./http/dashboard.js";
import { clampDeadline } from "./http/deadline.js";
import { healthRoutes } from "./http/health-routes.js";
import { sendJson } from "./http/json.js";
import { createListener, h2StreamWindow, listenOn } from "./http/listener.js";
import { metricsRoute, observeHttp } from "./http/metrics.js";
import { createPlainRouter, header } from "./http/routes.js";
import { askerOf } from "./http/source.js";
import { createTarpit } from "./http/tarpit.js";
import { createKnowledgeService } from "./knowledge/service.js";
import { createLeaseService } from "./leases/service.js";
import { createMetricsInterceptor } from "./metrics/interceptor.js";
import { directorRestRoutes } from "./rest/director.js";
import { createInProcessCaller } from "./rest/in-process.js";
import { workerRestRoutes } from "./rest/worker.js";
import { createAuthInterceptor } from "./rpc/auth-interceptor.js";
import { createErrorMapper, fixForWire, type ToClientError } from "./rpc/errors.js";
import { createHealthService } from "./rpc/health.js";
import { createNulInterceptor, createRpcInterceptor } from "./rpc/interceptors.js";
import { registerReflection, registryOf } from "./rpc/reflection.js";
import { createScheduleService } from "./schedules/service.js";
import { createKedaScaler } from "./scheduling/keda.js";
import { createConcurrencyService, createShareService } from "./scheduling/service.js";
import { toTask } from "./tasks/convert.js";
import { createTaskService } from "./tasks/service.js";
import { traceFromHeaders } from "./tracing/context.js";

export { clampDeadline } from "./http/deadline.js";

type Request = http.IncomingMessage | http2.Http2ServerRequest;
type Response = http.ServerResponse | http2.Http2ServerResponse;

const meshworkServices = [
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

/** The request's correlation id and trace context, set by the listener before any handler runs. */
const correlations = new WeakMap<Request, Correlation>();

/**
 * The correlation id a caller sent (x-correlation-id, or its alias
 * X-Ashlar-Correlation-Id) when it is sane (printable, ≤ 128 characters),
 * else "".
 */
function sentCorrelationId(req: Request): string {
  const given = req.headers["x-correlation-id"] ?? req.headers["x-ashlar-correlation-id"];
  const value = Array.isArray(given) ? given[0] : given;
  return value && /^[\x21-\x7e]{1,128}$/.test(value) ? value : "";
}

/** What a client may see of an error: refusals keep their code, reason and task; bugs are `internal`. */
const toClientError: ToClientError = createErrorMapper(toTask);

/** The source a refusal of the guard's throttle is for (it waits in the tarpit), else undefined. */
function throttledSource(refusal: DomainError, source: string | undefined): string | undefined {
  return refusal.reason === "AUTH_THROTTLED" ? source : undefined;
}

/** The reason a call's signal is aborted with when the call ends (what AbortController.abort() would make). */
const callEnded = new DOMException("This operation was aborted", "AbortError");

/** The Connect form of the guard's shared refusals, made once each. */
const earlyRefusals = new WeakMap<DomainError, ConnectError>();
function earlyRefusal(refusal: DomainError): ConnectError {
  let error = earlyRefusals.get(refusal);
  if (!error) {
    error = toClientError(refusal).error;
    earlyRefusals.set(refusal, error);
  }
  return error;
}

/**
 * The interceptors every RPC goes through (also for in-memory test
 * transports): metrics first, to count the code the client gets; then
 * logging and error mapping, so that refusals of
 * authentication are logged and mapped like any other; then auth; then the
 * refusal of strings PostgreSQL cannot hold (U+0000). The first also
 * gives each call its span (exported with `app.tracing`).
 */
export function rpcInterceptors(
  app: Pick<App, "log" | "guard" | "metrics"> & Partial<Pick<App, "tracing">>,
) {
  return [
    createMetricsInterceptor(app.metrics),
    createRpcInterceptor(app.log, toClientError, app.tracing),
    createAuthInterceptor(app.guard),
    createNulInterceptor(),
  ];
}

/**
 * The KEDA listener's handler (http/keda-listener.ts): KEDA's external
 * scaler only, gRPC, with the logging, error mapping and metrics of every
 * RPC; no auth (KEDA authenticates by TLS).
 */
export function kedaHandler(
  app: App,
): (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void {
  return connectNodeAdapter({
    routes: (router) =>
      router.service(ExternalScaler, createKedaScaler({ ...app, db: app.database.db })),
    interceptors: [
      createMetricsInterceptor(app.metrics),
      createRpcInterceptor(app.log, toClientError),
    ],
    grpcWeb: false,
    connect: false,
  });
}

/** Every RPC service Meshwork serves, for the Connect adapter and for in-memory test transports. */
export function createRoutes(app: App): (router: ConnectRouter) => void {
  const registry = registryOf([
    file_meshwork_v1_fleet,
    file_meshwork_v1_task,
    file_meshwork_v1_lease,
    file_meshwork_v1_artifact,
    file_meshwork_v1_knowledge,
    file_meshwork_v1_token,
    file_meshwork_v1_share,
    file_meshwork_v1_concurrency,
    file_meshwork_v1_schedule,
    file_meshwork_v1_errors,
    file_grpc_health_v1_health,
  ]);
  return (router: ConnectRouter) => {
    router.service(FleetService, createFleetService(app));
    router.service(TaskService, createTaskService(app));
    router.service(LeaseService, createLeaseService(app));
    router.service(ArtifactService, createArtifactService(app));
    router.service(KnowledgeService, createKnowledgeService(app));
    router.service(TokenService, createTokenService(app));
    router.service(ShareService, createShareService(app));
    router.service(ConcurrencyService, createConcurrencyService(app));
    router.service(ScheduleService, createScheduleService(app));
    // Open to anyone: its request is one short name, so it may read little.
    router.service(
      Health,
      createHealthService(
        meshworkServices.map((s) => s.typeName),
        app.ready,
        app.shutdownSignal,
      ),
      { readMaxBytes: 1024 },
    );
    registerReflection(router, registry, [...meshworkServices, Health]);
  };
}

/**
 * The request handler: Connect, gRPC and gRPC-Web for every service, the
 * standard health and reflection services, and the plain HTTP routes. It has
 * no side effects until a request arrives.
 */
export function createHandler(app: App) {
  const routes = createRoutes(app);
  // A source past its budget of failed authentications waits a second for
  // each refusal (http/tarpit.ts); as many at once as it may hold connections.
  // A connection that only ever fails to authenticate is closed (http/connection-trust.ts).
  const trust = createConnectionTrust();
  const tarpit = createTarpit({
    delayMs: 1000,
    perSource: Math.max(1, app.config.maxConnectionsPerSource || 256),
    total: 4096,
    // Headers-only guesses wait; one that may pile up a body is answered at once.
    maxBytesEach: 64 * 1024,
    maxBytes: 16 * 1024 * 1024,
  });
  const connect = createConnectHandler({
    routes,
    interceptors: rpcInterceptors(app),
    // Largest message, after decompression: connect-node reads at most this
    // much of a body and inflates a compressed one only up to it (zlib's
    // maxOutputLength), so a small gzip bomb is refused while inflating.
    // Encodings other than gzip and br are refused (unimplemented).
    readMaxBytes: app.config.readMaxBytes,
    // A backstop: longer deadlines are shortened by clampDeadline first,
    // because connect-node refuses them (invalid_argument) rather than clamp.
    maxTimeoutMs: app.config.maxTimeoutMs,
    // Responses are gzipped only when large (big listings); artifact chunks
    // (64 KiB) never are: compressing bytes that are often compressed already
    // cut DownloadArtifact to ~25 MB/s. Compressed requests are accepted.
    compressMinBytes: 1024 * 1024,
    // A misspelt field in Connect JSON is an error, not silently dropped.
    jsonOptions: { ignoreUnknownFields: false },
    shutdownSignal: app.shutdownSignal,
    // A body that stops mid-way is ended (http/body-guard.ts).
    bodyIdleMs: app.config.bodyTimeoutMs,
    log: app.log,
    // Runs before a byte of the body is read, in every protocol, and what
    // it throws is answered in the call's own protocol (401 for Connect,
    // grpc-status 16 for gRPC and gRPC-Web; 429 past the source's budget of
    // failed authentications). Here the bearer token is checked from the
    // headers alone: a request without a valid token costs no body buffer,
    // no handler and no parse, and what it sent is dropped with it
    // (closeUnread below). The caller rides on in kPreauthenticated: the
    // auth interceptor checks only the method's rule and ownership then.
    //
    // connect-es passes every error to the call's `abort` (not in its public
    // type) right before it serializes it: there, an undecodable request
    // becomes `invalid_argument`, not `internal`, and a message gRPC could
    // not encode is mended (rpc/errors.ts, fixForWire).
    requestGate: async (context) => {
      const call = context as typeof context & { abort?: (reason?: unknown) => void };
      const abort = call.abort;
      if (typeof abort === "function") {
        call.abort = (reason?: unknown) => {
          fixForWire(reason);
          // Every call ends with an abort without a reason (its signal's
          // listeners let go): the AbortError AbortController makes then
          // captures a stack, a few percent of a no-op call's cost. One
          // made up front stands for it.
          abort.call(context, reason ?? callEnded);
        };
      }
      if (!app.guard.enabled || openServices.has(context.service.typeName)) return;
      try {
        const principal = await app.guard.authenticate(
          context.requestHeader.get("authorization"),
          context.values.get(kAsker),
        );
        app.guard.rateLimit(principal);
        context.values.set(kPreauthenticated, principal);
      } catch (error) {
        throw toClientError(error).error;
      }
    },
    refuseEarly: (req, service) => {
      if (!app.guard.enabled || openServices.has(service)) return undefined;
      const asker = askerOf(req, h2StreamWindow, trust);
      const decided = app.guard.precheck(header(req, "authorization"), asker);
      if (!(decided instanceof DomainError)) return undefined;
      return {
        error: earlyRefusal(decided),
        throttled: throttledSource(decided, asker.source),
        mayBuffer: asker.mayBuffer ?? 0,
      };
    },
    tarpit,
    contextValues: (req) =>
      correlationValues(correlations.get(req) ?? { id: randomUUID(), sent: "" }).set(
        kAsker,
        askerOf(req, h2StreamWindow, trust),
      ),
  });
  // The REST routes call the services in process, through the same interceptors.
  const call = createInProcessCaller(routes, rpcInterceptors(app));
  const plainRoutes = [
    ...healthRoutes(app),
    metricsRoute(app),
    ...byteRoutes(app),
    ...workerRestRoutes(call, app.config.readMaxBytes),
    ...directorRestRoutes({ call, maxBodyBytes: app.config.readMaxBytes }),
    // Last: GET / and /assets/* (the web dashboard) shadow nothing above.
    ...dashboardRoutes(),
  ];
  // An RPC's path goes straight to Connect, past the plain routes' patterns
  // (two passes over them for a path none takes): so none may take one.
  for (const route of plainRoutes) {
    const taken = [...connect.paths].find((path) => route.pattern.test(path));
    if (taken) throw new Error(`the plain route for "${route.what}" would take the RPC ${taken}`);
  }
  const plain = createPlainRouter(plainRoutes, app.guard, toClientError, app.log, {
    bodyIdleMs: app.config.bodyTimeoutMs,
    h2Window: h2StreamWindow,
    onRoute: observeHttp(app.metrics),
    tarpit,
    trust,
  });
  return (req: Request, res: Response) => {
    // Once answered: a body nobody read is dropped, a condemned connection closed.
    const socket = req.socket;
    res.once("finish", () => {
      if (trust.condemned(socket)) socket.destroy();
      else closeUnread(req, socket);
    });
    const sent = sentCorrelationId(req);
    const correlation = {
      id: sent || randomUUID(),
      sent,
      // W3C trace context: the caller's when valid, else a new trace (never refused).
      trace: traceFromHeaders(header(req, "traceparent"), header(req, "tracestate")),
    };
    correlations.set(req, correlation);
    res.setHeader("x-correlation-id", correlation.id);
    if (req.url?.startsWith("/api/mesh")) res.setHeader("x-ashlar-correlation-id", correlation.id);
    const path = (req.url ?? "/").split("?", 1)[0] ?? "/";
    if (!connect.paths.has(path) && plain(req, res, path, correlation)) return;
    clampDeadline(req, app.config.maxTimeoutMs);
    connect(req as http.IncomingMessage, res as http.ServerResponse);
  };
}

export interface RunningServer {
  /** The bound address, e.g. http://127.0.0.1:43127. */
  url: string;
  port: number;
  /** Stops accepting, lets in-flight requests finish (bounded grace), ends streams. */
  close(): Promise<void>;
}

/** A port bound before the app exists: it answers 503 until `serve` gives it the app. */
export interface BoundListener {
  url: string;
  port: number;
  /** Starts the app (sweeper, notifications) and serves it on the bound port. */
  serve(app: App): Promise<RunningServer>;
  /** Unbinds without serving (start-up failed after the bind). */
  close(): Promise<void>;
}

/**
 * Binds the port, one listener for HTTP/1.1 and cleartext HTTP/2
 * (http/listener.ts), before anything else happens: a coordinator that
 * cannot listen fails before it opens the database or touches its data
 * directory. Until `serve`, every request is answered 503 (starting).
 */
export async function bind(
  config: Pick<App["config"], "tlsCert" | "tlsKey"> &
    Parameters<typeof createListener>[1]["limits"],
  listenAddress: string,
): Promise<BoundListener> {
  let handler: (req: Request, res: Response) => void = (req, res) => {
    // Alive while starting (migrations may take a while): only liveness says so.
    if (req.url === "/healthz") return sendJson(res, 200, { status: "starting" });
    res.setHeader("retry-after", "1");
    sendJson(res, 503, { error: "unavailable", message: "the coordinator is starting" });
  };
  let inFlight = 0;
  let idle: (() => void) | undefined;
  let tls: { cert: Buffer; key: Buffer } | undefined;
  if (config.tlsCert) {
    try {
      tls = { cert: readFileSync(config.tlsCert), key: readFileSync(config.tlsKey) };
      createSecureContext(tls);
    } catch (error) {
      throw new StartupError(
        `cannot use the TLS certificate ${config.tlsCert} with the key ${config.tlsKey}: ${(error as Error).message.split("\n")[0]}`,
      );
    }
  }
  const server = createListener(
    (req, res) => {
      inFlight++;
      res.on("close", () => {
        inFlight--;
        if (inFlight === 0) idle?.();
      });
      handler(req, res);
    },
    { tls, limits: config },
  );
  const listening = await listenOn(server, splitHostPort(listenAddress), tls ? "https" : "http");
  const { url, port: bound, sockets } = listening;
  const unbind = listening.closeNow;
  return {
    url,
    port: bound,
    close: unbind,
    async serve(app) {
      await app.start();
      handler = createHandler(app);
      return {
        url,
        port: bound,
        async close() {
          const closed = new Promise<void>((resolve) => server.close(() => resolve()));
          await app.stop();
          if (inFlight > 0) {
            await new Promise<void>((resolve) => {
              const timer = setTimeout(resolve, app.config.shutdownGraceMs);
              idle = () => {
                clearTimeout(timer);
                resolve();
              };
            });
          }
          for (const s of sockets) s.destroy();
          await closed;
          // Last: requests still running in the grace period use the store.
          await app.blobs.close?.().catch((error: unknown) => {
            app.log.warn({ err: error }, "closing the blob store failed");
          });
        },
      };
    },
  };
}

/** Binds `listenAddress` and serves the app there (sweeper and notifications started). */
export async function listen(app: App, listenAddress: string): Promise<RunningServer> {
  return (await bind(app.config, listenAddress)).serve(app);
}
