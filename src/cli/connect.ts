import { readFileSync } from "node:fs";
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { adminTokenPath } from "../config.js";

/** A coordinator to talk to, and the bearer token to present ("" for none). */
export interface Endpoint {
  url: string;
  token: string;
}

/** The default coordinator: $MESHWORK_URL, else the default listen address. */
export function defaultUrl(env: NodeJS.ProcessEnv = process.env): string {
  return env.MESHWORK_URL || "http://127.0.0.1:8080";
}

/**
 * The token a command presents: --token, else $MESHWORK_TOKEN, else the
 * admin token that the coordinator wrote on its first start in the local
 * data dir (--data-dir, $MESHWORK_DATA_DIR or ./.meshwork); "" when none.
 */
export function resolveToken(
  flag: string | undefined,
  dataDir: string | undefined,
  env: NodeJS.ProcessEnv = process.env,
): string {
  if (flag) return flag;
  if (env.MESHWORK_TOKEN) return env.MESHWORK_TOKEN;
  try {
    return readFileSync(
      adminTokenPath(dataDir || env.MESHWORK_DATA_DIR || "./.meshwork"),
      "utf8",
    ).trim();
  } catch {
    return "";
  }
}

/** A Connect transport (HTTP/1.1, JSON-free binary) that presents the endpoint's token. */
export function transportFor(endpoint: Endpoint): Transport {
  const bearer: Interceptor = (next) => (req) => {
    if (endpoint.token) req.header.set("authorization", `Bearer ${endpoint.token}`);
    return next(req);
  };
  return createConnectTransport({
    baseUrl: endpoint.url,
    httpVersion: "1.1",
    interceptors: [bearer],
  });
}
