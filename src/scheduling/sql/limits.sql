-- Flow control: a concurrency_key's limit (how many of its tasks hold live
-- leases at once, concurrency_limits) and a rate_key's token bucket (how
-- many of its leases are granted per second, rate_limits). Both are
-- decided here, under the key's row lock, in the transaction that grants
-- the lease (the claim and push placement), so that replicas never grant
-- past a limit together. A key without a row is not limited.
--
-- A limit counts live leases (live-lease.sql) rather than keeping a
-- counter: a lease that ends, whichever way (completion, failure, expiry,
-- cancellation, release, deregistration), gives its slot back without any
-- path having to remember to.

-- The live leases of tasks with `ck`, but `except_task`'s: one lookup on
-- tasks_concurrency_idx. plpgsql, planned once per connection, with an
-- index scan, as the counts of resources.sql (which say why).
CREATE OR REPLACE FUNCTION meshwork_key_running(ck text, except_task uuid DEFAULT NULL) RETURNS int
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
  RETURN (SELECT count(*)::int FROM tasks t
    WHERE t.concurrency_key = ck AND t.concurrency_key <> ''
      AND meshwork_lease_live(t)
      AND t.id IS DISTINCT FROM except_task);
END;
$$;

-- What a rate bucket holds now: its tokens, refilled at per_second since
-- refilled_at, at most burst.
CREATE OR REPLACE FUNCTION meshwork_rate_tokens(r rate_limits) RETURNS float8
LANGUAGE sql STABLE AS $$
  SELECT least(r.burst::float8,
    r.tokens + r.per_second * greatest(0, extract(epoch FROM now() - r.refilled_at))::float8)
$$;

-- Whether a lease of task `t_id` (concurrency key `ck`, rate key `rk`) may
-- be granted now; if so, its rate token is taken. NULL when it may, else
-- why not: 'CONCURRENCY_LIMIT', 'RATE_LIMIT', or 'BUSY' when another
-- transaction holds the key's row and `wait` is false (a claim skips the
-- task rather than wait behind another claim; placement waits). `held` is
-- how many tasks of `ck` the caller took already and has not granted yet
-- (a claim of several). The key rows stay locked until the caller's
-- transaction ends, so the count cannot change under it.
CREATE OR REPLACE FUNCTION meshwork_limits_take(t_id uuid, ck text, rk text, wait boolean, held int DEFAULT 0)
RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  lim int;
  bucket rate_limits;
  available float8;
BEGIN
  IF ck <> '' THEN
    IF wait THEN
      SELECT l.max_running INTO lim FROM concurrency_limits l WHERE l.key = ck FOR UPDATE;
    ELSE
      SELECT l.max_running INTO lim FROM concurrency_limits l WHERE l.key = ck FOR UPDATE SKIP LOCKED;
      IF NOT FOUND AND EXISTS (SELECT 1 FROM concurrency_limits l WHERE l.key = ck) THEN
        RETURN 'BUSY';
      END IF;
    END IF;
    IF lim IS NOT NULL AND meshwork_key_running(ck, t_id) + held >= lim THEN
      RETURN 'CONCURRENCY_LIMIT';
    END IF;
  END IF;
  IF rk <> '' THEN
    IF wait THEN
      SELECT * INTO bucket FROM rate_limits r WHERE r.key = rk FOR UPDATE;
    ELSE
      SELECT * INTO bucket FROM rate_limits r WHERE r.key = rk FOR UPDATE SKIP LOCKED;
      IF NOT FOUND AND EXISTS (SELECT 1 FROM rate_limits r WHERE r.key = rk) THEN
        RETURN 'BUSY';
      END IF;
    END IF;
    IF bucket.key IS NOT NULL THEN
      available := meshwork_rate_tokens(bucket);
      IF available < 1 THEN
        RETURN 'RATE_LIMIT';
      END IF;
      -- greatest(): a transaction that began before the last taker's must not
      -- move refilled_at back, or the time between the two is refilled twice.
      UPDATE rate_limits r SET tokens = available - 1, refilled_at = greatest(r.refilled_at, now())
        WHERE r.key = rk;
    END IF;
  END IF;
  RETURN NULL;
END;
$$;

-- Whether a limit holds task `t_id` (keys `ck`, `rk`) back now, read
-- without locking or taking anything: its concurrency key at its limit, or
-- its rate bucket short of a token. A reservation is not made, or kept, for
-- a task a limit holds back (claim.sql): the worker's resources would sit
-- idle for as long as the limit lasts.
CREATE OR REPLACE FUNCTION meshwork_limits_hold(t_id uuid, ck text, rk text) RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT (ck <> '' AND EXISTS (
            SELECT 1 FROM concurrency_limits l
            WHERE l.key = ck AND meshwork_key_running(ck, t_id) >= l.max_running))
      OR (rk <> '' AND EXISTS (
            SELECT 1 FROM rate_limits r WHERE r.key = rk AND meshwork_rate_tokens(r) < 1))
$$;
