-- The ready epoch: a number every change that may put a task ahead of the
-- first ready one moves (history.sql, and the sweeper when a not_before
-- passes). A sequence: not versioned, so that reading it costs the same
-- behind a transaction held open, and seen by every replica at once.
CREATE SEQUENCE IF NOT EXISTS meshwork_ready_epoch;
-- Claims that arrive together go to the database together: one statement
-- runs each through meshwork_claim (claim.sql: the rules and plan choices
-- are all there) and answers, after each claim, the worker's cap and the
-- slots it has left, so that a ClaimTasks answer takes one round trip
-- instead of two. The slots are counted once per claim, under the
-- worker's lock, before it: the claim starts from that count (a worker
-- that offers more than slots has its whole allocation counted by the
-- claim as well), and the answer is that count and the slots of the tasks
-- it took; a lease that ends while the claim runs shows in the next
-- answer. Counted again after the claim, as it was, the count walked the
-- worker's index entries a second time: every lease it was granted in the
-- last lease_seconds, dead versions included, which behind a transaction
-- held open is most of what a claim reads.
--
-- `claims` is a JSON array of {"worker", "caps", "labels", "max",
-- "concurrency", "plan", "reserveAfterMs", "expiredFrom"} (concurrency
-- null: the registered max_concurrency; plan, reserveAfterMs and
-- expiredFrom as meshwork_claim takes them, null when not given; the batch
-- moves expiredFrom on to the first expired lease, below). The
-- slots counted are the `slots` resource: the cap less what the worker's
-- live leases hold. Rows: the claimed tasks of claim 0 in claim order
-- (free and cap null), then one
-- row for claim 0 with its free slots and cap (task null; none for an
-- unknown worker), then claim 1, and so on; last, when a task was ready,
-- one row with claim -1 whose task.progress_message is the batch's `hint`
-- for the next one (below), never a task given to anyone.
--
-- One transaction holds every worker lock it takes until it ends. The
-- caller orders the claims by worker id, so that two batches (on two
-- replicas) take worker locks in the same order and cannot deadlock each
-- other.
--
-- A batch waits at most 2 s for a worker's lock (held by a placement, a
-- deregistration, another replica's batch): past that, the database refuses
-- the batch (55P03), its claims are made again one by one (leases/store.ts)
-- and only the claim for the locked worker waits and fails (`unavailable`).
-- Without it, one lock held long would hold every claim of the replica.
--
-- The first ready task. Each claim looks from its key (priority, deadline,
-- created_at) first (claim.sql, ready_*), so the batch finds it once: the
-- head of tasks_ready_idx holds an entry for every task claimed since the
-- last vacuum, and while a transaction is held open none can be removed.
-- It is found from `hint` when it can be: {"priority", "deadline",
-- "created", "epoch", "head", "headMs"}, the first ready task a batch of
-- this replica found before, with the ready epoch it read first (and
-- whether it was found from the head, and how long that took; the batch
-- reads neither "head" nor "headMs"). While the epoch has not
-- moved, no task has become ready ahead of that one but new tasks of
-- priority 0 without a deadline, which come after it (a hint of a
-- negative priority is not used, for that reason), and tasks whose
-- not_before passed since the sweeper last looked (it moves the epoch
-- within a second of that): the batch looks
-- from the hint within its priority and deadline, past the entries of the
-- tasks claimed before it, and from the head only when that runs out.
-- The caller drops a hint after its life (leases/claim.ts): a task made
-- ready by a transaction that moved the epoch before this batch read it
-- but committed after its snapshot, or created by a transaction that began
-- before the hint's task was created, is found when it ends. The life is a
-- second while looks from the head are quick. The hint says how long the
-- look from the head took (`headMs`): behind a transaction held open that
-- look walks the entry of every task claimed since it began (and many
-- delayed tasks ahead of the first ready one slow it too), and the caller
-- then keeps a hint longer (50 times the quickest of the last three looks,
-- up to a minute), so that looking from the head takes at most a fiftieth
-- of the time, or one look a minute.
DROP FUNCTION IF EXISTS meshwork_claim_batch(jsonb);
CREATE OR REPLACE FUNCTION meshwork_claim_batch(claims jsonb, hint jsonb DEFAULT NULL)
RETURNS TABLE (claim int, free int, cap int, task tasks)
LANGUAGE plpgsql VOLATILE
SET jit = off
SET lock_timeout = '2s'
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
  c jsonb;
  i int := 0;
  w uuid;
  k int;
  epoch bigint;
  head tasks;
  got tasks;
  registered int;             -- the worker's max_concurrency
  held bigint;                -- the slots its live leases hold before the claim
  took bigint;                -- the slots of the tasks the claim took
  found_head boolean := false;
  from_hint boolean := false;
  looked timestamptz;
  head_ms numeric;            -- how long the look from the head took
  expired_at timestamptz;     -- where the claims look for expired leases from (null: not looked yet)
  locked boolean;             -- the claim's worker is known and not drained
BEGIN
  -- Read before the head: a change that moves it after this is seen by the next batch.
  SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END INTO epoch FROM meshwork_ready_epoch s;
  IF hint IS NOT NULL AND (hint->>'epoch')::bigint = epoch AND (hint->>'priority')::int >= 0 THEN
    IF hint->>'deadline' IS NULL THEN
      SELECT t.* INTO head FROM tasks t
        WHERE t.state = 'PENDING' AND t.dependencies_pending = 0
          AND t.priority = (hint->>'priority')::int AND t.deadline IS NULL
          AND t.created_at >= (hint->>'created')::timestamptz
          AND (t.not_before IS NULL OR t.not_before <= now())
        ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC
        LIMIT 1;
    ELSE
      SELECT t.* INTO head FROM tasks t
        WHERE t.state = 'PENDING' AND t.dependencies_pending = 0
          AND t.priority = (hint->>'priority')::int AND t.deadline = (hint->>'deadline')::timestamptz
          AND t.created_at >= (hint->>'created')::timestamptz
          AND (t.not_before IS NULL OR t.not_before <= now())
        ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC
        LIMIT 1;
    END IF;
    found_head := FOUND;
    from_hint := FOUND;
  END IF;
  IF NOT found_head THEN
    looked := clock_timestamp();
    SELECT t.* INTO head FROM tasks t
      WHERE t.state = 'PENDING' AND t.dependencies_pending = 0
        AND (t.not_before IS NULL OR t.not_before <= now())
      ORDER BY t.priority DESC NULLS LAST, t.deadline ASC NULLS LAST, t.created_at ASC, t.id ASC
      LIMIT 1;
    found_head := FOUND;
    head_ms := extract(epoch FROM clock_timestamp() - looked) * 1000;
  END IF;
  FOR c IN SELECT e FROM jsonb_array_elements(claims) AS e LOOP
    w := (c->>'worker')::uuid;
    k := (c->>'concurrency')::int;
    -- The worker's lock (the claim takes it again, at no cost) and its
    -- slots, counted once: the claim starts from them, and the answer is
    -- them and what the claim took. A drained worker, which the claim
    -- leaves alone, is counted without its lock.
    SELECT x.max_concurrency INTO registered FROM workers x
      WHERE x.id = w AND NOT x.drained FOR NO KEY UPDATE;
    locked := FOUND;
    IF NOT FOUND THEN
      SELECT x.max_concurrency INTO registered FROM workers x WHERE x.id = w;
    END IF;
    held := CASE WHEN FOUND THEN meshwork_slots_held(w) END;
    took := 0;
    -- The first expired lease a claim may take over, any worker's, from
    -- the earliest mark of the batch's claims (`expiredFrom`, the
    -- sweeper's: claim.sql, expired_from), looked for once, by the first
    -- claim that has a slot free (the others stop before their look):
    -- each claim looks for expired leases first, from this one on (an
    -- empty range, 'infinity', when there is none). From the mark on,
    -- tasks_lease_expiry_idx holds the entry of every lease that ran out
    -- or ended since; behind a transaction held open none of them can be
    -- removed (22,560 entries, 8 ms to walk, from a mark 6 s back in a
    -- drain of 3,000 tasks/s), and each claim of a batch walked them all.
    -- A lease whose expiry another transaction commits in the past while
    -- the batch runs (moved there by hand, or granted by a transaction
    -- that began earlier) and comes before the one found is the next
    -- batch's.
    IF expired_at IS NULL AND locked AND held < coalesce(k, registered) THEN
      SELECT t.lease_expires_at INTO expired_at FROM tasks t
        WHERE meshwork_lease_expired(t)
          AND t.lease_expires_at >= (SELECT min(coalesce((e->>'expiredFrom')::timestamptz, '-infinity'))
            FROM jsonb_array_elements(claims) AS e)
          AND t.failures < t.max_attempts
        ORDER BY t.lease_expires_at
        LIMIT 1;
      expired_at := coalesce(expired_at, 'infinity');
    END IF;
    FOR got IN
      SELECT * FROM meshwork_claim(
        w,
        ARRAY(SELECT jsonb_array_elements_text(c->'caps')),
        c->'labels',
        (c->>'max')::int,
        k,
        CASE WHEN jsonb_typeof(c->'plan') = 'object' THEN c->'plan' END,
        (c->>'reserveAfterMs')::int,
        greatest((c->>'expiredFrom')::timestamptz, expired_at),
        head.priority, head.deadline, head.created_at,
        held)
    LOOP
      claim := i;
      free := NULL;
      cap := NULL;
      task := got;
      RETURN NEXT;
      took := took + coalesce((got.resources->>'slots')::bigint, 0);
    END LOOP;
    IF held IS NOT NULL THEN
      claim := i;
      cap := coalesce(k, registered);
      free := greatest(0, cap - (held + took));
      task := NULL;
      RETURN NEXT;
    END IF;
    i := i + 1;
  END LOOP;
  IF found_head THEN
    RETURN QUERY SELECT -1, NULL::int, NULL::int,
      jsonb_populate_record(NULL::tasks, jsonb_build_object('progress_message',
        jsonb_build_object('priority', head.priority, 'deadline', head.deadline,
          'created', head.created_at, 'epoch', epoch, 'head', NOT from_hint,
          'headMs', round(head_ms, 3))::text));
  END IF;
END;
$$;
