import type { Metrics } from "../metrics/metrics.js";
import type { PlainRoute, Request, Response } from "./routes.js";

/**
 * `GET /metrics`: the app's metrics in the Prometheus text format
 * (docs/metrics.md). Behind a token of role admin or client, like the other
 * read routes, unless `--metrics-public on` opens it to anyone (a scraper
 * on a private network). A worker token is refused: workers have no need
 * to see the whole queue.
 */
export function metricsRoute(app: {
  config: { metricsPublic: boolean };
  metrics: Pick<Metrics, "registry" | "scrape">;
}): PlainRoute {
  return {
    methods: ["GET"],
    pattern: /^\/metrics$/,
    roles: app.config.metricsPublic ? "open" : ["client"],
    what: "read metrics",
    async handle({ res }) {
      const text = await app.metrics.scrape();
      res.writeHead(200, { "content-type": app.metrics.registry.contentType });
      res.end(text);
    },
  };
}

/**
 * Counts a plain HTTP request and observes its duration when its response
 * closes, labelled with the route's fixed description (`what`), never the
 * raw path, and the status sent.
 */
export function observeHttp(metrics: Pick<Metrics, "httpRequests" | "httpDuration">) {
  return (route: PlainRoute, req: Request, res: Response): void => {
    const end = metrics.httpDuration.startTimer();
    res.once("close", () => {
      const labels = {
        route: route.what,
        method: req.method ?? "GET",
        status: String(res.statusCode),
      };
      end(labels);
      metrics.httpRequests.inc(labels);
    });
  };
}
