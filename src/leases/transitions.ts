import type { Db } from "../db/database.js";
import { lazy } from "../db/lazy.js";
import { completeStatement } from "./sql/complete.js";
import { failPastDeadlineStatement } from "./sql/deadline.js";
import { expireStatement } from "./sql/expire.js";
import { failStatement } from "./sql/fail.js";
import { judgedManyStatement, judgedStatement, leaseByTokenStatement } from "./sql/refusal.js";
import { releaseStatement } from "./sql/release.js";
import { renewManyStatement, renewStatement } from "./sql/renew.js";
import { retriesDueByWorkloadStatement, retryDueStatement } from "./sql/retries.js";
import { startStatement } from "./sql/start.js";
import { timeoutStatement } from "./sql/timeout.js";

export { released, releaseWorker } from "./sql/release.js";

/**
 * The lease transitions other than the claim (sql/claim.sql, through
 * claim.ts): one file each in sql/, with its why-comments and plan
 * decisions. Each is one conditional UPDATE whose WHERE is the lease check
 * (core/lease-check.ts, over sql/live-lease.sql) or the expiry rule, so that
 * zero rows is the answer "refused" and nothing is read first. Each is
 * prepared on first use and kept (db/lazy.ts).
 */
export function createTransitions(db: Db) {
  return {
    judged: lazy(() => judgedStatement(db)),
    judgedMany: lazy(() => judgedManyStatement(db)),
    leaseByToken: lazy(() => leaseByTokenStatement(db)),
    start: lazy(() => startStatement(db)),
    renew: lazy(() => renewStatement(db)),
    renewMany: lazy(() => renewManyStatement(db)),
    complete: lazy(() => completeStatement(db)),
    fail: lazy(() => failStatement(db)),
    release: lazy(() => releaseStatement(db)),
    expire: lazy(() => expireStatement(db)),
    failPastDeadline: lazy(() => failPastDeadlineStatement(db)),
    timeout: lazy(() => timeoutStatement(db)),
    retryDue: lazy(() => retryDueStatement(db)),
    retriesDueByWorkload: lazy(() => retriesDueByWorkloadStatement(db)),
  };
}
