import { sql } from "drizzle-orm";
import {
  bigint,
  boolean,
  customType,
  doublePrecision,
  index,
  integer,
  jsonb,
  pgTable,
  primaryKey,
  text,
  timestamp,
  uniqueIndex,
  uuid,
} from "drizzle-orm/pg-core";

// Millisecond precision, so that a time read into a JS Date and sent back (page
// tokens, comparisons) is exactly the stored one.
const timestamptz = (name: string) =>
  timestamp(name, { withTimezone: true, mode: "date", precision: 3 });

/** Registered workers. `state` (ACTIVE/LOST) is derived from last_heartbeat_at on read. */
export const workers = pgTable(
  "workers",
  {
    id: uuid("id").primaryKey(),
    name: text("name").notNull().default(""),
    capabilities: text("capabilities").array().notNull().default(sql`'{}'::text[]`),
    labels: jsonb("labels").$type<Record<string, string>>().notNull().default({}),
    cpuCount: integer("cpu_count").notNull().default(0),
    memoryMb: bigint("memory_mb", { mode: "number" }).notNull().default(0),
    apiBaseUrl: text("api_base_url").notNull().default(""),
    maxConcurrency: integer("max_concurrency").notNull().default(1),
    drained: boolean("drained").notNull().default(false),
    queueDepth: integer("queue_depth").notNull().default(0),
    // The token that registered the worker: a worker token acts only for its own workers.
    ownerTokenId: uuid("owner_token_id"),
    // A caller-chosen stable name (the director routes' peerId); unique when set.
    peerId: text("peer_id").unique("workers_peer_id_key"),
    registeredAt: timestamptz("registered_at").notNull().defaultNow(),
    // Pushed work (fleet/dispatch): where it is POSTed, the secret that signs it
    // (write-only), and the address the registration came from (--dispatch-allow).
    dispatchPath: text("dispatch_path").notNull().default("/meshwork/tasks"),
    dispatchSecret: text("dispatch_secret"),
    registeredFrom: text("registered_from").notNull().default(""),
    lastHeartbeatAt: timestamptz("last_heartbeat_at").notNull().defaultNow(),
    // What the worker offers, resource name → quantity, `slots` aside (that
    // is max_concurrency): its stated capacity, with cpu (cpu_count × 1000)
    // and memory (memory_mb) filled in at registration when not stated.
    capacity: jsonb("capacity").$type<Resources>().notNull().default({}),
    // The large task the worker is held for (src/leases/sql/claim.sql).
    reservedTaskId: uuid("reserved_task_id"),
    reservedAt: timestamptz("reserved_at"),
  },
  (t) => [
    index("workers_registered_idx").on(t.registeredAt, t.id),
    // One worker held for a task at most: two claims on two replicas cannot
    // both reserve it (the second's reservation is refused and skipped).
    uniqueIndex("workers_reserved_task_idx")
      .on(t.reservedTaskId)
      .where(sql`${t.reservedTaskId} is not null`),
  ],
);

/** Resource name → quantity (docs/scheduling.md). */
export type Resources = Record<string, number>;

/** A label requirement as stored: Kubernetes node affinity's operators. */
export interface RequirementJson {
  key: string;
  op: "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt";
  values: string[];
}

/** A preference as stored: a requirement with its weight. */
export interface PreferenceJson extends RequirementJson {
  weight: number;
}

/** Stored form of an ArtifactRef (input or result). */
export interface ArtifactRefJson {
  artifactId: string;
  uri: string;
  sha256: string;
  sizeBytes: number;
  contentType: string;
}

/**
 * Tasks and their current lease. A lease is (id, attempt) held by
 * lease_worker_id until lease_expires_at; the lease columns are kept after
 * the task finishes so that a repeated completion can be recognised.
 */
export const tasks = pgTable(
  "tasks",
  {
    id: uuid("id").primaryKey(),
    name: text("name").notNull().default(""),
    workload: text("workload").notNull(),
    requiredCapabilities: text("required_capabilities")
      .array()
      .notNull()
      .default(sql`'{}'::text[]`),
    affinity: jsonb("affinity").$type<Record<string, string>>().notNull().default({}),
    priority: integer("priority").notNull().default(0),
    deadline: timestamptz("deadline"),
    parameters: jsonb("parameters").$type<Record<string, unknown>>(),
    input: jsonb("input").$type<ArtifactRefJson>(),
    steps: integer("steps"),
    state: text("state").$type<TaskStateName>().notNull(),
    attempt: integer("attempt").notNull().default(0),
    // Attempts given back by ReleaseTask: they do not count against max_attempts.
    releases: integer("releases").notNull().default(0),
    // Failed attempts, counted against max_attempts: attempts minus releases.
    failures: integer("failures").notNull().generatedAlwaysAs(sql`attempt - releases`),
    maxAttempts: integer("max_attempts").notNull(),
    leaseSeconds: integer("lease_seconds").notNull(),
    backoffInitialMs: integer("backoff_initial_ms").notNull(),
    backoffMaxMs: integer("backoff_max_ms").notNull(),
    backoffMultiplier: doublePrecision("backoff_multiplier").notNull(),
    idempotencyKey: text("idempotency_key"),
    // SHA-256 of the normalised create request, to tell a retry from a conflict.
    requestHash: text("request_hash"),
    correlationId: text("correlation_id").notNull().default(""),
    // W3C trace context of the create request (docs/tracing.md), returned in claims.
    traceParent: text("trace_parent").notNull().default(""),
    traceState: text("trace_state").notNull().default(""),
    assignedWorkerId: uuid("assigned_worker_id"),
    assignedApiBaseUrl: text("assigned_api_base_url").notNull().default(""),
    scheduleIdempotencyKey: text("schedule_idempotency_key"),
    leaseWorkerId: uuid("lease_worker_id"),
    leaseToken: text("lease_token"),
    leaseExpiresAt: timestamptz("lease_expires_at"),
    checkpointHandle: text("checkpoint_handle").notNull().default(""),
    progressSteps: integer("progress_steps").notNull().default(0),
    progressMessage: text("progress_message").notNull().default(""),
    result: jsonb("result").$type<ArtifactRefJson>(),
    resultSummary: text("result_summary").notNull().default(""),
    metrics: jsonb("metrics").$type<Record<string, number>>().notNull().default({}),
    // SHA-256 of the accepted completion manifest, to tell a repeat from a conflict.
    completionHash: text("completion_hash"),
    errorCode: text("error_code").notNull().default(""),
    errorMessage: text("error_message").notNull().default(""),
    cancelRequested: boolean("cancel_requested").notNull().default(false),
    notBefore: timestamptz("not_before"),
    createdAt: timestamptz("created_at").notNull().defaultNow(),
    updatedAt: timestamptz("updated_at").notNull().defaultNow(),
    startedAt: timestamptz("started_at"),
    finishedAt: timestamptz("finished_at"),
    // What one attempt holds on its worker; always has `slots`.
    resources: jsonb("resources").$type<Resources>().notNull().default({ slots: 1 }),
    requirements: jsonb("requirements").$type<RequirementJson[]>().notNull().default([]),
    preferences: jsonb("preferences").$type<PreferenceJson[]>().notNull().default([]),
    // The share-tree path the task is charged to.
    share: text("share").notNull().default("default"),
    concurrencyKey: text("concurrency_key").notNull().default(""),
    rateKey: text("rate_key").notNull().default(""),
    // Workflows (docs/workflows.md). run_at: the start asked for (not_before
    // holds the task back); while depends_on has unfinished tasks, not_before
    // is 'infinity' (tasks/sql/dependencies.sql, edges in task_dependencies).
    runAt: timestamptz("run_at"),
    ref: text("ref").notNull().default(""),
    dependsOn: uuid("depends_on").array().notNull().default(sql`'{}'::uuid[]`),
    dependencyPolicy: text("dependency_policy")
      .$type<"ALL_SUCCEEDED" | "ALL_DONE">()
      .notNull()
      .default("ALL_SUCCEEDED"),
    dependenciesPending: integer("dependencies_pending").notNull().default(0),
    // The bound on an attempt's running time, and the current attempt's end by it (grant.sql).
    timeoutSeconds: integer("timeout_seconds"),
    attemptDeadline: timestamptz("attempt_deadline"),
    resultValue: jsonb("result_value").$type<Record<string, unknown>>(),
    scheduleId: uuid("schedule_id"),
    // Whether a push placement is delivered by the coordinator (deliveries).
    dispatch: boolean("dispatch").notNull().default(false),
  },
  (t) => [
    uniqueIndex("tasks_idempotency_key_idx")
      .on(t.idempotencyKey)
      .where(sql`${t.idempotencyKey} is not null`),
    // The claim scan: PENDING tasks in claim order.
    index("tasks_claim_idx")
      .on(t.priority.desc(), t.deadline.asc().nullsLast(), t.createdAt.asc())
      .where(sql`${t.state} = 'PENDING'`),
    // A share's PENDING tasks in its order (a claim's plan, queue positions).
    // The claim's walks (leases/sql/claim.sql) go over the tasks that may
    // run once due: a task waiting for its dependencies (not_before
    // 'infinity') is not in them, so a claim behind a large waiting graph
    // does not step over it (tasks_claim_idx still holds every PENDING
    // task, for the counts and the waiting reasons).
    // Tasks created in the same millisecond (created_at is kept to the
    // millisecond; every task of one CreateTasks call shares it) go by id:
    // time-ordered, so in the order they were made.
    index("tasks_ready_idx")
      .on(t.priority.desc(), t.deadline.asc().nullsLast(), t.createdAt.asc(), t.id.asc())
      .where(sql`${t.state} = 'PENDING' and ${t.dependenciesPending} = 0`),
    index("tasks_share_claim_idx")
      .on(t.share, t.priority.desc(), t.deadline.asc().nullsLast(), t.createdAt.asc(), t.id.asc())
      .where(sql`${t.state} = 'PENDING' and ${t.dependenciesPending} = 0`),
    // The PENDING tasks of a rate key (the sweeper wakes their claims when its bucket refills).
    index("tasks_rate_idx")
      .on(t.rateKey, t.workload)
      .where(sql`${t.state} = 'PENDING' and ${t.rateKey} <> ''`),
    // The live leases of a concurrency key (its limit).
    index("tasks_concurrency_idx")
      .on(t.concurrencyKey)
      .where(sql`${t.state} in ('ASSIGNED', 'RUNNING') and ${t.concurrencyKey} <> ''`),
    // Expired-lease scans (claims and the sweeper).
    index("tasks_lease_expiry_idx")
      .on(t.leaseExpiresAt)
      .where(sql`${t.state} in ('ASSIGNED', 'RUNNING')`),
    // A worker's live leases (its slot counts): by expiry within the worker,
    // so that a count starts at now() and never reads the entries of leases
    // that ran out, which stay in the index until a vacuum can remove them
    // (a transaction held open keeps every one the worker ever held).
    index("tasks_lease_worker_expiry_idx")
      .on(t.leaseWorkerId, t.leaseExpiresAt)
      .where(sql`${t.state} in ('ASSIGNED', 'RUNNING')`),
    index("tasks_deadline_idx")
      .on(t.deadline)
      .where(sql`${t.state} = 'PENDING' and ${t.deadline} is not null`),
    // The sweeper's retry wake-up scan (retryDue): PENDING tasks in backoff.
    index("tasks_retry_idx")
      .on(t.notBefore)
      .where(sql`${t.state} = 'PENDING' and ${t.notBefore} is not null`),
    // The sweeper's timeout scan: live attempts with a bound on their running time.
    index("tasks_attempt_deadline_idx")
      .on(t.attemptDeadline)
      .where(sql`${t.state} in ('ASSIGNED', 'RUNNING') and ${t.attemptDeadline} is not null`),
    // A schedule's live task (its overlap policy).
    index("tasks_schedule_idx")
      .on(t.scheduleId)
      .where(sql`${t.scheduleId} is not null and ${t.state} in ('PENDING', 'ASSIGNED', 'RUNNING')`),
    // Retention: finished tasks, oldest first.
    index("tasks_finished_idx")
      .on(t.finishedAt)
      .where(sql`${t.state} in ('SUCCEEDED', 'FAILED', 'CANCELED')`),
    // Which tasks name an input artifact (retention, unused inputs).
    index("tasks_input_artifact_idx")
      .on(sql`(${t.input}->>'artifactId')`)
      .where(sql`${t.input} is not null`),
    index("tasks_created_idx").on(t.createdAt.desc(), t.id.desc()),
    index("tasks_correlation_idx").on(t.correlationId),
    index("tasks_workload_state_idx").on(t.workload, t.state),
  ],
);

/**
 * Coordinator-owned bytes. The bytes live once per SHA-256 in the blob
 * store; a row exists only after its blob is durable. `task_id` is null for
 * an INPUT uploaded before its task.
 */
export const artifacts = pgTable(
  "artifacts",
  {
    id: uuid("id").primaryKey(),
    taskId: uuid("task_id"),
    attempt: integer("attempt").notNull().default(0),
    workerId: uuid("worker_id"),
    filename: text("filename").notNull(),
    contentType: text("content_type").notNull().default(""),
    kind: text("kind").$type<ArtifactKindName>().notNull(),
    sha256: text("sha256").notNull(),
    sizeBytes: bigint("size_bytes", { mode: "number" }).notNull(),
    createdAt: timestamptz("created_at").notNull().defaultNow(),
  },
  (t) => [
    index("artifacts_task_idx").on(t.taskId, t.createdAt, t.id),
    // Whether other rows still hold the same bytes (retention deletes a blob after its last row).
    index("artifacts_sha256_idx").on(t.sha256),
  ],
);

/** Raw bytes; PGlite gives a Uint8Array, postgres.js a Buffer (one). */
const bytea = customType<{ data: Uint8Array; driverData: Uint8Array }>({
  dataType: () => "bytea",
});

/**
 * Uploads being staged into `blob_chunks` (`--blob-store postgres`), one row
 * from stage() to commit or discard. Every chunk written moves `touched_at`:
 * a row left untouched for long is an upload a crash abandoned, removed with
 * its chunks by whichever replica sweeps first.
 */
export const blobUploads = pgTable(
  "blob_uploads",
  {
    id: uuid("id").primaryKey(),
    createdAt: timestamptz("created_at").notNull().defaultNow(),
    touchedAt: timestamptz("touched_at").notNull().defaultNow(),
  },
  (t) => [index("blob_uploads_touched_idx").on(t.touchedAt)],
);

/**
 * The bytes of an upload, staged or committed, in chunks numbered from 0:
 * each `blobs.chunk_bytes` long but the last.
 */
export const blobChunks = pgTable(
  "blob_chunks",
  {
    uploadId: uuid("upload_id").notNull(),
    seq: integer("seq").notNull(),
    data: bytea("data").notNull(),
  },
  (t) => [primaryKey({ columns: [t.uploadId, t.seq] })],
);

/**
 * Committed blobs of `--blob-store postgres`: the bytes of `sha256` are the
 * chunks of upload `upload_id`. One row per SHA-256, so equal bytes are kept
 * once.
 */
export const blobs = pgTable("blobs", {
  sha256: text("sha256").primaryKey(),
  uploadId: uuid("upload_id").notNull(),
  sizeBytes: bigint("size_bytes", { mode: "number" }).notNull(),
  chunkBytes: integer("chunk_bytes").notNull(),
  createdAt: timestamptz("created_at").notNull().defaultNow(),
});

/**
 * Stored bytes found not to hash to their SHA-256 (bit rot, a disk fault, a
 * hand that edited a blob file), whichever blob store holds them. A
 * download of them is refused until the same bytes are uploaded again,
 * which replaces the copy and removes the row (artifacts/verify.ts).
 */
export const corruptBlobs = pgTable("corrupt_blobs", {
  sha256: text("sha256").primaryKey(),
  foundAt: timestamptz("found_at").notNull().defaultNow(),
});

/**
 * Versioned knowledge entries ("adaptations", "patterns") that coordinators
 * sync. Merge order: version, then updated_at, then origin.
 */
export const knowledgeEntries = pgTable(
  "knowledge_entries",
  {
    kind: text("kind").notNull(),
    key: text("key").notNull(),
    value: jsonb("value").$type<Record<string, unknown>>().notNull(),
    version: bigint("version", { mode: "number" }).notNull(),
    updatedAt: timestamptz("updated_at").notNull(),
    origin: text("origin").notNull(),
  },
  (t) => [
    primaryKey({ columns: [t.kind, t.key] }),
    index("knowledge_updated_idx").on(t.updatedAt, t.kind, t.key),
  ],
);

export type TokenRoleName = "admin" | "client" | "worker";

/**
 * Bearer tokens. Only the SHA-256 digest of a token is stored; the token
 * itself is shown once, when it is made. A revoked token stays, so that its
 * name and history remain readable.
 */
export const tokens = pgTable(
  "tokens",
  {
    id: uuid("id").primaryKey(),
    name: text("name").notNull(),
    role: text("role").$type<TokenRoleName>().notNull(),
    digest: text("digest").notNull(),
    createdAt: timestamptz("created_at").notNull().defaultNow(),
    lastUsedAt: timestamptz("last_used_at"),
    revokedAt: timestamptz("revoked_at"),
  },
  (t) => [
    uniqueIndex("tokens_name_idx").on(t.name),
    uniqueIndex("tokens_digest_idx").on(t.digest),
    index("tokens_created_idx").on(t.createdAt.desc(), t.id.desc()),
  ],
);

export type TokenRow = typeof tokens.$inferSelect;

/** Facts about this coordinator's database, e.g. its stable `origin` id. */
export const coordinatorMeta = pgTable("coordinator_meta", {
  key: text("key").primaryKey(),
  value: text("value").notNull(),
});

export type KnowledgeRow = typeof knowledgeEntries.$inferSelect;

export type ArtifactKindName = "INPUT" | "OUTPUT" | "CHECKPOINT";
export type ArtifactRow = typeof artifacts.$inferSelect;

export type TaskStateName =
  | "PENDING"
  | "ASSIGNED"
  | "RUNNING"
  | "SUCCEEDED"
  | "FAILED"
  | "CANCELED";
export type TaskRow = typeof tasks.$inferSelect;
export type WorkerRow = typeof workers.$inferSelect;

/**
 * Weights of the share tree (ShareService.SetShare): a node without a row
 * weighs 1.
 */
export const shares = pgTable("shares", {
  path: text("path").primaryKey(),
  weight: doublePrecision("weight").notNull(),
});

/**
 * Each share's usage: the fraction of the fleet its running leases held,
 * averaged with exponential decay (scheduling/usage.ts), as of updated_at.
 */
export const shareUsage = pgTable("share_usage", {
  path: text("path").primaryKey(),
  usage: doublePrecision("usage").notNull(),
  updatedAt: timestamptz("updated_at").notNull().defaultNow(),
});

/** Concurrency limits by key (ConcurrencyService.SetLimit). */
export const concurrencyLimits = pgTable("concurrency_limits", {
  key: text("key").primaryKey(),
  maxRunning: integer("max_running").notNull(),
});

/** Rates by key (ConcurrencyService.SetRate): a token bucket each. */
export const rateLimits = pgTable("rate_limits", {
  key: text("key").primaryKey(),
  perSecond: doublePrecision("per_second").notNull(),
  burst: integer("burst").notNull(),
  tokens: doublePrecision("tokens").notNull(),
  refilledAt: timestamptz("refilled_at").notNull().defaultNow(),
});

/**
 * Which text of the database functions (src/db/functions.ts) is installed:
 * one row, its version and the hash of its files. A starting replica
 * replaces the functions only with a version at least as new, so that two
 * replicas of two releases never undo each other's functions.
 */
export const dbFunctions = pgTable("meshwork_functions", {
  key: text("key").primaryKey(),
  version: integer("version").notNull(),
  hash: text("hash").notNull(),
  appliedAt: timestamptz("applied_at").notNull().defaultNow(),
});
