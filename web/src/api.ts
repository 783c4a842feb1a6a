import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { KnowledgeService } from "../../gen/meshwork/v1/knowledge_pb.js";
import { ScheduleService } from "../../gen/meshwork/v1/schedule_pb.js";
import { ShareService } from "../../gen/meshwork/v1/share_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import { TokenRole, TokenService } from "../../gen/meshwork/v1/token_pb.js";

const tokenKey = "meshwork.token";

/**
 * The token lives in sessionStorage: this tab only, gone when the tab
 * closes, never in the URL, a cookie or localStorage.
 */
export const session = {
  get token(): string {
    return sessionStorage.getItem(tokenKey) ?? "";
  },
  set token(value: string) {
    if (value) sessionStorage.setItem(tokenKey, value);
    else sessionStorage.removeItem(tokenKey);
  },
};

/** Sends the session's token on every call, as for any other client. */
const bearer: Interceptor = (next) => (req) => {
  const token = session.token;
  if (token) req.header.set("authorization", `Bearer ${token}`);
  return next(req);
};

/** Called when a call is refused as unauthenticated (the app signs out). */
let onUnauthenticated: (message: string) => void = () => {};
export function whenUnauthenticated(fn: (message: string) => void): void {
  onUnauthenticated = fn;
}

const signOutOn401: Interceptor = (next) => async (req) => {
  try {
    return await next(req);
  } catch (error) {
    const e = ConnectError.from(error);
    if (e.code === Code.Unauthenticated && session.token) onUnauthenticated(describe(e));
    throw error;
  }
};

// Same origin: the dashboard is served by the coordinator it talks to.
const transport = createConnectTransport({
  baseUrl: location.origin,
  useBinaryFormat: true,
  interceptors: [signOutOn401, bearer],
});

export const fleet = createClient(FleetService, transport);
export const tasks = createClient(TaskService, transport);
export const artifacts = createClient(ArtifactService, transport);
export const knowledge = createClient(KnowledgeService, transport);
export const shares = createClient(ShareService, transport);
export const schedules = createClient(ScheduleService, transport);
const tokens = createClient(TokenService, transport);

/** What the signed-in token may do, as the dashboard offers it (the coordinator decides). */
export interface Abilities {
  role: "admin" | "client" | "worker";
  /** Cancel, rerun, retry tasks (client and admin). */
  manageTasks: boolean;
  /** Drain, undrain, prune workers (admin; a worker token only its own, not offered here). */
  manageWorkers: boolean;
}

let abilities: Promise<Abilities> | undefined;
let abilitiesOf = "";
/** The signed-in token's role (TokenService.WhoAmI), asked once per token. */
export function whatMayI(): Promise<Abilities> {
  if (!abilities || abilitiesOf !== session.token) {
    abilitiesOf = session.token;
    abilities = tokens.whoAmI({}).then(
      ({ token }) => {
        const role =
          token?.role === TokenRole.ADMIN
            ? "admin"
            : token?.role === TokenRole.WORKER
              ? "worker"
              : "client";
        return { role, manageTasks: role !== "worker", manageWorkers: role === "admin" };
      },
      () => {
        abilities = undefined;
        return { role: "client", manageTasks: true, manageWorkers: false };
      },
    );
  }
  return abilities;
}

/** An RPC error as a user reads it: "permission_denied: …", never a stack. */
export function describe(error: unknown): string {
  if (error instanceof DOMException && error.name === "AbortError") return "canceled";
  const e = ConnectError.from(error);
  return `${codeToString(e.code)}: ${e.rawMessage || "no message"}`;
}

/** True for the error an aborted call ends with (the page was left). */
export function isAbort(error: unknown): boolean {
  return (
    (error instanceof DOMException && error.name === "AbortError") ||
    (error instanceof ConnectError && error.code === Code.Canceled)
  );
}

/**
 * Downloads an artifact's bytes with the token (a plain link cannot send the
 * Authorization header) and saves them under `filename`.
 */
export async function download(artifactId: string, filename: string): Promise<void> {
  const res = await fetch(`/artifacts/${encodeURIComponent(artifactId)}/download`, {
    headers: { authorization: `Bearer ${session.token}` },
  });
  if (!res.ok) {
    const body = (await res.json().catch(() => ({}))) as { error?: string; message?: string };
    throw new Error(`${body.error ?? res.status}: ${body.message ?? res.statusText}`);
  }
  const url = URL.createObjectURL(await res.blob());
  const a = document.createElement("a");
  a.href = url;
  a.download = filename || artifactId;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
