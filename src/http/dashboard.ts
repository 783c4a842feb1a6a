import { existsSync, readdirSync, readFileSync } from "node:fs";
import type * as http from "node:http";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { sendJson } from "./json.js";
import { header, type PlainRoute, type Response } from "./routes.js";

/** One built file of the dashboard, held in memory (the whole bundle is a few hundred KiB). */
interface WebFile {
  body: Buffer;
  contentType: string;
}

const contentTypes: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".map": "application/json",
};

/**
 * The package root: the nearest folder above this module with Meshwork's
 * package.json. The same from src/http (a git checkout run by tsx) and from
 * dist/src/http (the built code, in a checkout or an installed package).
 */
function packageRoot(): string | undefined {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const manifest = join(dir, "package.json");
    if (existsSync(manifest)) {
      try {
        if ((JSON.parse(readFileSync(manifest, "utf8")) as { name?: string }).name === "meshwork") {
          return dir;
        }
      } catch {}
    }
    const up = dirname(dir);
    if (up === dir) return undefined;
    dir = up;
  }
}

/** The built dashboard (`npm run build` → dist/web/), or undefined when it was never built. */
function loadWeb(webDir: string): { index: Buffer; assets: Map<string, WebFile> } | undefined {
  const indexPath = join(webDir, "index.html");
  if (!existsSync(indexPath)) return undefined;
  const assets = new Map<string, WebFile>();
  const assetDir = join(webDir, "assets");
  if (existsSync(assetDir)) {
    for (const name of readdirSync(assetDir)) {
      const ext = /\.[a-z]+$/.exec(name)?.[0] ?? "";
      const contentType = contentTypes[ext];
      if (!contentType) continue;
      assets.set(name, { body: readFileSync(join(assetDir, name)), contentType });
    }
  }
  return { index: readFileSync(indexPath), assets };
}

/**
 * What a browser may do with the dashboard's pages: run only its own
 * script and style, talk only to this origin, never be framed.
 */
const securityHeaders = {
  "content-security-policy":
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "x-frame-options": "DENY",
};

function send(
  res: Response,
  status: number,
  headers: Record<string, string>,
  body: Buffer,
  head: boolean,
) {
  (res as http.ServerResponse).writeHead(status, {
    ...securityHeaders,
    ...headers,
    "content-length": body.length,
  });
  if (head) res.end();
  else res.end(body);
}

/**
 * The web dashboard (docs/dashboard.md): GET / answers index.html and
 * /assets/<name> the bundle and the stylesheet that `npm run build` wrote to
 * dist/web/. The routes are open: the files hold no data; every datum comes
 * through the RPCs, with the token the user enters. Only files listed at
 * start-up are served (a name is a map key, never a path), so no request can
 * reach outside dist/web/. Asset names carry a content hash: cached for a
 * year; index.html is revalidated every time (no-cache).
 *
 * A client that asks for JSON only (`Accept: application/json`) gets a short
 * JSON answer at / instead of a page.
 */
export function dashboardRoutes(webDir = join(packageRoot() ?? ".", "dist", "web")): PlainRoute[] {
  let web: ReturnType<typeof loadWeb> | null = null;
  const built = () => {
    if (web === null) web = loadWeb(webDir);
    return web;
  };
  return [
    {
      methods: ["GET", "HEAD"],
      pattern: /^\/(?:index\.html)?$/,
      roles: "open",
      what: "load the dashboard",
      async handle({ req, res }) {
        const accept = header(req, "accept");
        if (/application\/json/.test(accept) && !/text\/html/.test(accept)) {
          sendJson(res, 200, {
            service: "meshwork",
            dashboard: "/",
            rpc: "/meshwork.v1.<Service>/<Method>",
            health: ["/healthz", "/readyz"],
          });
          return;
        }
        const w = built();
        if (!w) {
          sendJson(res, 404, {
            error: "not_found",
            message: "the dashboard is not built: run `npm run build` (it writes dist/web/)",
          });
          return;
        }
        send(
          res,
          200,
          { "content-type": "text/html; charset=utf-8", "cache-control": "no-cache" },
          w.index,
          req.method === "HEAD",
        );
      },
    },
    {
      methods: ["GET", "HEAD"],
      pattern: /^\/assets\/([^/]*)$/,
      roles: "open",
      what: "load the dashboard",
      async handle({ req, res, match }) {
        const file = built()?.assets.get(match[1] ?? "");
        if (!file) {
          sendJson(res, 404, { error: "not_found", message: "no such dashboard asset" });
          return;
        }
        send(
          res,
          200,
          {
            "content-type": file.contentType,
            "cache-control": "public, max-age=31536000, immutable",
          },
          file.body,
          req.method === "HEAD",
        );
      },
    },
  ];
}
