-- Label selectors: a task's requirements (all must hold for a worker's
-- labels) and preferences (a worker scores the weights of those it meets),
-- with Kubernetes node affinity's operators. A requirement is stored as
-- {"key", "op", "values"} (op In, NotIn, Exists, DoesNotExist, Gt, Lt);
-- a preference as the same with "weight". Matching (match.sql) and the
-- waiting reasons use these, and no other reading of them.

-- Whether `labels` meet one requirement `r`. Gt and Lt compare integers:
-- a label that is not one fails them (checked before the cast, so a
-- non-integer label is an answer, never an error).
CREATE OR REPLACE FUNCTION meshwork_requirement_holds(r jsonb, labels jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE r->>'op'
    WHEN 'In' THEN coalesce((r->'values') ? (labels->>(r->>'key')), false)
    WHEN 'NotIn' THEN NOT coalesce((r->'values') ? (labels->>(r->>'key')), false)
    WHEN 'Exists' THEN labels ? (r->>'key')
    WHEN 'DoesNotExist' THEN NOT (labels ? (r->>'key'))
    WHEN 'Gt' THEN CASE WHEN labels->>(r->>'key') ~ '^-?[0-9]{1,18}$'
      THEN (labels->>(r->>'key'))::bigint > (r->'values'->>0)::bigint ELSE false END
    WHEN 'Lt' THEN CASE WHEN labels->>(r->>'key') ~ '^-?[0-9]{1,18}$'
      THEN (labels->>(r->>'key'))::bigint < (r->'values'->>0)::bigint ELSE false END
    ELSE false
  END
$$;

-- Whether `labels` meet every requirement of `reqs` (none: true).
CREATE OR REPLACE FUNCTION meshwork_requirements_hold(reqs jsonb, labels jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
  SELECT reqs = '[]'::jsonb OR NOT EXISTS (
    SELECT 1 FROM jsonb_array_elements(reqs) AS r WHERE NOT meshwork_requirement_holds(r, labels))
$$;

-- A worker's score for a task's preferences: the weights of those its
-- labels meet (none: 0).
CREATE OR REPLACE FUNCTION meshwork_preference_score(prefs jsonb, labels jsonb) RETURNS int
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN prefs = '[]'::jsonb THEN 0 ELSE coalesce((
    SELECT sum((p->>'weight')::int) FROM jsonb_array_elements(prefs) AS p
    WHERE meshwork_requirement_holds(p, labels)), 0)::int END
$$;

-- Whether `labels` meet every preference of `prefs` (a pull claim takes
-- the tasks whose preferences it meets only in part after the others).
CREATE OR REPLACE FUNCTION meshwork_preferences_met(prefs jsonb, labels jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
  SELECT NOT EXISTS (
    SELECT 1 FROM jsonb_array_elements(prefs) AS p WHERE NOT meshwork_requirement_holds(p, labels))
$$;

-- The most a worker can score for `prefs`: every weight.
CREATE OR REPLACE FUNCTION meshwork_preference_max(prefs jsonb) RETURNS int
LANGUAGE sql IMMUTABLE AS $$
  SELECT coalesce((SELECT sum((p->>'weight')::int) FROM jsonb_array_elements(prefs) AS p), 0)::int
$$;
