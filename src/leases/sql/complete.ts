import { and, getTableColumns, sql } from "drizzle-orm";
import { leaseHeldBy } from "../../core/lease-check.js";
import type { Db } from "../../db/database.js";
import { tasks } from "../../db/schema/index.js";

const p = sql.placeholder;
const columns = getTableColumns(tasks);

/**
 * Completions, each judged on its own, applied in one statement. A result
 * must be an artifact of this task and attempt with the sha256 sent; the
 * stored result is the coordinator's record of it.
 */
export function completeStatement(db: Db) {
  return db
    .update(tasks)
    .set({
      state: "SUCCEEDED",
      result: sql`case when v.result is null then null else (
      select jsonb_build_object('artifactId', a.id, 'uri', v.result->>'uri', 'sha256', a.sha256,
        'sizeBytes', a.size_bytes, 'contentType', a.content_type)
      from artifacts a where a.id = (v.result->>'artifactId')::uuid) end`,
      // An item leaves out an empty summary and metrics (store.ts).
      resultSummary: sql`coalesce(v.summary, '')`,
      metrics: sql`coalesce(v.metrics, '{}'::jsonb)`,
      resultValue: sql`v.value`,
      completionHash: sql`v.hash`,
      errorCode: "",
      errorMessage: "",
      finishedAt: sql`now()`,
      updatedAt: sql`now()`,
    })
    .from(
      sql`jsonb_to_recordset(${p("items")}::jsonb) as v(id uuid, attempt int, worker_id uuid, token text, result jsonb, summary text, metrics jsonb, value jsonb, hash text)`,
    )
    .where(
      and(
        leaseHeldBy({
          id: sql`v.id`,
          attempt: sql`v.attempt`,
          worker: sql`v.worker_id`,
          token: sql`v.token`,
        }),
        sql`(v.result is null or exists (select 1 from artifacts a
        where a.id = (v.result->>'artifactId')::uuid and a.task_id = v.id
        and a.attempt = v.attempt and a.sha256 = v.result->>'sha256'))`,
      ),
    )
    .returning(columns)
    .prepare("meshwork_complete");
}
