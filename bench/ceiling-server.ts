/**
 * The transport ceiling of docs/benchmarks.md, run by bench/compare.ts as
 * its own process (as the coordinator is): a bare connect-node server,
 * `connectNodeAdapter` on `http2.createServer` (h2c), TCP_NODELAY on, one
 * no-op unary method (grpc.health.v1.Health/Check answering SERVING), no
 * interceptors, no database. Listens on 127.0.0.1 and a free port, prints
 * `{"port":N}` on stdout once listening; stops on SIGTERM.
 */
import * as http2 from "node:http2";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { Health, HealthCheckResponse_ServingStatus } from "../gen/grpc/health/v1/health_pb.js";

const handler = connectNodeAdapter({
  routes(router) {
    router.rpc(Health.method.check, () => ({
      status: HealthCheckResponse_ServingStatus.SERVING,
    }));
  },
});
const server = http2.createServer(handler);
server.on("connection", (socket: import("node:net").Socket) => socket.setNoDelay(true));
server.listen(0, "127.0.0.1", () => {
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : 0;
  process.stdout.write(`${JSON.stringify({ port })}\n`);
});
process.on("SIGTERM", () => {
  server.close();
  process.exit(0);
});
