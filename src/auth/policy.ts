import type { TokenRoleName } from "../db/schema/index.js";

/**
 * Who may call each RPC. Admin may call everything; `roles` lists the other
 * roles allowed. `actsFor` names the workers a request acts for: a worker
 * token may act only for workers registered with it. An RPC missing here is
 * admin only (test/rpc/auth.test.ts, "has a rule for every RPC it serves",
 * checks that every served RPC has a rule, so a new one cannot slip through
 * unprotected by accident).
 */
export interface MethodRule {
  roles: readonly TokenRoleName[];
  actsFor?: (message: Record<string, unknown>) => string[];
  /** A rule that depends on the message (uploads: inputs vs task artifacts). */
  check?: (role: TokenRoleName, message: Record<string, unknown>) => string | undefined;
}

/** Services anyone may call, without a token. */
export const openServices = new Set(["grpc.health.v1.Health"]);

const worker = ["worker"] as const;
const client = ["client"] as const;
const anyRole = ["client", "worker"] as const;

const own = (m: Record<string, unknown>): string[] =>
  typeof m.workerId === "string" ? [m.workerId] : [];

const uploadHeader = (m: Record<string, unknown>) => {
  const payload = m.payload as { case?: string; value?: Record<string, unknown> } | undefined;
  return payload?.case === "header" ? payload.value : undefined;
};

export const policy: Record<string, MethodRule> = {
  // Fleet: workers register and look after themselves; clients read the fleet.
  "meshwork.v1.FleetService/RegisterWorker": { roles: worker, actsFor: own },
  "meshwork.v1.FleetService/GetWorker": { roles: anyRole },
  "meshwork.v1.FleetService/ListWorkers": { roles: client },
  "meshwork.v1.FleetService/Heartbeat": { roles: worker, actsFor: own },
  "meshwork.v1.FleetService/DrainWorker": { roles: worker, actsFor: own },
  "meshwork.v1.FleetService/DeregisterWorker": { roles: worker, actsFor: own },
  "meshwork.v1.FleetService/GetFleetStatus": { roles: client },
  "meshwork.v1.FleetService/PruneWorkers": { roles: [] },
  // Tasks and placement: clients.
  "meshwork.v1.TaskService/CreateTask": { roles: client },
  "meshwork.v1.TaskService/CreateTasks": { roles: client },
  "meshwork.v1.TaskService/GetTask": { roles: client },
  "meshwork.v1.TaskService/ListTasks": { roles: client },
  "meshwork.v1.TaskService/ListTaskEvents": { roles: client },
  "meshwork.v1.TaskService/WatchTask": { roles: client },
  "meshwork.v1.TaskService/GetTaskLogs": { roles: client },
  "meshwork.v1.TaskService/WatchTaskLogs": { roles: client },
  "meshwork.v1.TaskService/CancelTask": { roles: client },
  "meshwork.v1.TaskService/ScheduleTask": { roles: client },
  "meshwork.v1.TaskService/RetryTask": { roles: client },
  "meshwork.v1.TaskService/RerunTask": { roles: client },
  "meshwork.v1.TaskService/RerunTasks": { roles: client },
  "meshwork.v1.TaskService/CancelTasks": { roles: client },
  // Leases: workers, for their own workers.
  "meshwork.v1.LeaseService/ClaimTasks": { roles: worker, actsFor: own },
  "meshwork.v1.LeaseService/StartTask": { roles: worker, actsFor: own },
  "meshwork.v1.LeaseService/RenewLease": { roles: worker, actsFor: own },
  "meshwork.v1.LeaseService/StreamLeases": { roles: worker, actsFor: own },
  "meshwork.v1.LeaseService/CompleteTask": { roles: worker, actsFor: own },
  "meshwork.v1.LeaseService/CompleteTasks": {
    roles: worker,
    actsFor: (m) => ((m.completions as Record<string, unknown>[] | undefined) ?? []).flatMap(own),
  },
  "meshwork.v1.LeaseService/FailTask": { roles: worker, actsFor: own },
  "meshwork.v1.LeaseService/ReleaseTask": { roles: worker, actsFor: own },
  // Each line names its worker: checked on every message of the stream.
  "meshwork.v1.LeaseService/AppendLogs": { roles: worker, actsFor: own },
  // Artifacts: clients upload inputs, workers their tasks' artifacts; both download.
  "meshwork.v1.ArtifactService/UploadArtifact": {
    roles: anyRole,
    actsFor: (m) => {
      const h = uploadHeader(m);
      return h && h.taskId !== "" ? own(h) : [];
    },
    check: (role, m) => {
      const h = uploadHeader(m);
      if (!h || role === "admin") return undefined;
      if (h.taskId === "" && role !== "client")
        return "upload an input (an artifact without task_id)";
      if (h.taskId !== "" && role !== "worker") return "upload a task's artifact";
      return undefined;
    },
  },
  "meshwork.v1.ArtifactService/DownloadArtifact": { roles: anyRole },
  "meshwork.v1.ArtifactService/GetArtifact": { roles: anyRole },
  "meshwork.v1.ArtifactService/ListArtifacts": { roles: anyRole },
  // Reads every stored blob: admin only.
  "meshwork.v1.ArtifactService/VerifyArtifacts": { roles: [] },
  // Knowledge: clients (directors).
  "meshwork.v1.KnowledgeService/PutEntry": { roles: client },
  "meshwork.v1.KnowledgeService/GetEntry": { roles: client },
  "meshwork.v1.KnowledgeService/ListEntries": { roles: client },
  "meshwork.v1.KnowledgeService/DeleteEntry": { roles: client },
  "meshwork.v1.KnowledgeService/ExportKnowledge": { roles: client },
  "meshwork.v1.KnowledgeService/ImportKnowledge": { roles: client },
  // Scheduling: admins set weights, limits and rates; clients read them.
  "meshwork.v1.ShareService/SetShare": { roles: [] },
  "meshwork.v1.ShareService/DeleteShare": { roles: [] },
  "meshwork.v1.ShareService/ListShares": { roles: client },
  "meshwork.v1.ConcurrencyService/SetLimit": { roles: [] },
  "meshwork.v1.ConcurrencyService/DeleteLimit": { roles: [] },
  "meshwork.v1.ConcurrencyService/ListLimits": { roles: client },
  "meshwork.v1.ConcurrencyService/SetRate": { roles: [] },
  "meshwork.v1.ConcurrencyService/DeleteRate": { roles: [] },
  "meshwork.v1.ConcurrencyService/ListRates": { roles: client },
  // Schedules: clients, who create the tasks the schedules create, and admins.
  "meshwork.v1.ScheduleService/CreateSchedule": { roles: client },
  "meshwork.v1.ScheduleService/GetSchedule": { roles: client },
  "meshwork.v1.ScheduleService/ListSchedules": { roles: client },
  "meshwork.v1.ScheduleService/PauseSchedule": { roles: client },
  "meshwork.v1.ScheduleService/ResumeSchedule": { roles: client },
  "meshwork.v1.ScheduleService/DeleteSchedule": { roles: client },
  "meshwork.v1.ScheduleService/TriggerSchedule": { roles: client },
  // Tokens: admin only.
  "meshwork.v1.TokenService/CreateToken": { roles: [] },
  "meshwork.v1.TokenService/ListTokens": { roles: [] },
  "meshwork.v1.TokenService/RevokeToken": { roles: [] },
  "meshwork.v1.TokenService/WhoAmI": { roles: anyRole },
  // Reflection: any valid token.
  "grpc.reflection.v1.ServerReflection/ServerReflectionInfo": { roles: anyRole },
  "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": { roles: anyRole },
};

export const adminOnly: MethodRule = { roles: [] };
