-- Whether a worker offering `caps` and `labels` fits task `t`: its workload
-- and every required capability offered, and every affinity entry equal to
-- one of the worker's labels. The one matching rule, with two callers: the
-- claim (meshwork_claim_matches below, pull) and push placement
-- (tasks/placement.ts, which offers the capabilities of meshwork_offered).
-- Plain SQL functions, inlined by the planner where they are used.
CREATE OR REPLACE FUNCTION meshwork_fits(t tasks, caps text[], labels jsonb) RETURNS boolean
LANGUAGE sql STABLE
AS $$
  SELECT t.workload = ANY (caps)
     AND t.required_capabilities <@ caps
     AND t.affinity <@ labels
$$;

-- What a claim may take: a task the worker fits, before its deadline (past
-- it, the sweeper fails the task).
CREATE OR REPLACE FUNCTION meshwork_claim_matches(t tasks, caps text[], labels jsonb) RETURNS boolean
LANGUAGE sql STABLE
AS $$
  SELECT (t.deadline IS NULL OR t.deadline > now()) AND meshwork_fits(t, caps, labels)
$$;

-- The capabilities a worker offers for push placement: those it advertises,
-- plus `<id>` for every label value `brick:<id>` (docs/protocol.md, push
-- placement: for placement only, a claim offers what the worker sends).
CREATE OR REPLACE FUNCTION meshwork_offered(caps text[], labels jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE
AS $$
  SELECT caps || ARRAY(
    SELECT substr(l.value, 7) FROM jsonb_each_text(labels) AS l
    WHERE l.value LIKE 'brick:%')
$$;
