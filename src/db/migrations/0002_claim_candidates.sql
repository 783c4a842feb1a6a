-- The PENDING tasks a worker may claim, best first, locked (SKIP LOCKED).
--
-- A function so that its plan is pinned: with parameters (or with statistics
-- that do not know a new workload yet) the planner estimated one matching
-- row and chose a bitmap scan of every PENDING task plus a sort, so each
-- claim cost O(backlog): 10 ms at 20,000 pending tasks, seen here. With
-- sorts and bitmap scans priced out, it walks tasks_claim_idx in claim order
-- and stops at the LIMIT. A function scan is also computed once per
-- statement, so the claim UPDATE cannot rescan it.
CREATE FUNCTION meshwork_claim_candidates(caps text[], labels jsonb, max_tasks int)
RETURNS TABLE (task_id uuid, task_priority int, task_deadline timestamptz, task_created_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET enable_sort = off
SET enable_bitmapscan = off
AS $$
BEGIN
  RETURN QUERY
    SELECT t.id, t.priority, t.deadline, t.created_at
    FROM tasks t
    WHERE t.state = 'PENDING'
      AND (t.not_before IS NULL OR t.not_before <= now())
      AND (t.deadline IS NULL OR t.deadline > now())
      AND t.workload = ANY (caps)
      AND t.required_capabilities <@ caps
      AND t.affinity <@ labels
    ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC
    LIMIT max_tasks
    FOR UPDATE OF t SKIP LOCKED;
END;
$$;
