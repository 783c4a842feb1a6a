import { sendJson } from "./json.js";
import type { PlainRoute } from "./routes.js";

/** Liveness and readiness: open to anyone, for load balancers and orchestrators. */
export function healthRoutes(app: { ready(): Promise<boolean> }): PlainRoute[] {
  return [
    {
      methods: ["GET"],
      pattern: /^\/healthz$/,
      roles: "open",
      what: "check liveness",
      async handle({ res }) {
        sendJson(res, 200, { status: "ok" });
      },
    },
    {
      methods: ["GET"],
      pattern: /^\/readyz$/,
      roles: "open",
      what: "check readiness",
      async handle({ res }) {
        if (await app.ready()) sendJson(res, 200, { status: "ready" });
        else sendJson(res, 503, { status: "database unreachable" });
      },
    },
  ];
}
