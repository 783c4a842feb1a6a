-- Whether a worker offering `caps` and `labels` fits task `t`: its workload
-- and every required capability offered, every affinity entry equal to
-- one of the worker's labels, and every requirement met by its labels
-- (scheduling/sql/selectors.sql). Resources are not matching: whether
-- they fit is decided against what is free (scheduling/sql/resources.sql). The one matching rule, with two callers: the
-- claim (meshwork_claim_matches below, pull) and push placement
-- (tasks/placement.ts, which offers the capabilities of meshwork_offered).
-- Plain SQL functions, inlined by the planner where they are used.
CREATE OR REPLACE FUNCTION meshwork_fits(t tasks, caps text[], labels jsonb) RETURNS boolean
LANGUAGE sql STABLE
AS $$
  SELECT t.workload = ANY (caps)
     AND t.required_capabilities <@ caps
     AND t.affinity <@ labels
     -- Most tasks state no requirement: that is told without calling the
     -- function (which the planner cannot inline: it holds a subquery).
     AND (t.requirements = '[]'::jsonb OR meshwork_requirements_hold(t.requirements, labels))
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
