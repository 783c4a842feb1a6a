import { randomFillSync } from "node:crypto";

/**
 * A new task's id: a time-ordered UUID (RFC 9562 version 7: 48 bits of
 * Unix milliseconds, then random bits; ids made by this process in the
 * same millisecond still sort in the order they were made).
 *
 * Every change of a task's state writes a new entry for its id into
 * tasks_pkey and task_events_task_idx (and, until migration 0023, the
 * events' foreign key looked the id up in tasks_pkey). With random ids
 * the 32 tasks of one claim sat on 32 different leaf pages of each,
 * spread over indexes that grow with the table: a claim of 32 plus its
 * CompleteTasks cost PostgreSQL 15.6 ms of CPU at 1,000,000 PENDING tasks
 * against 8.1 ms at 10,000. Tasks created together have neighbouring
 * ids, and a queue claims them close together, so their entries share a
 * few pages: 8.95 ms at 1,000,000
 * (bench/RESULTS.md, a backlog of one workload claimed in order).
 *
 * Ids stay opaque to clients (task.proto): the time in them is the
 * coordinator's clock when it made the id, about the task's created_at,
 * which a Task answers anyway.
 *
 * The layout is the `uuid` package's v7 (RFC 9562 section 6.2, method 1:
 * a 32-bit counter after the time, started at a random 31-bit value each
 * millisecond and counted up within it), made here from a pool of random
 * bytes filled 256 ids at a time: the package made one
 * `crypto.getRandomValues` call per id, 2 % of a CreateTasks of 1,000.
 */
export function newTaskId(): string {
  if (used === pool.length) {
    randomFillSync(pool);
    used = 0;
  }
  const r = used;
  used += 16;
  tick(clock, Date.now(), pool, r);
  return formatId(clock, pool, r);
}

/** The millisecond of the last id and its counter (a signed 32-bit integer: its bits are what counts). */
export interface IdClock {
  msecs: number;
  seq: number;
}

/**
 * Moves `clock` on for the next id at time `now`: a new millisecond starts
 * the counter at a random 31-bit value (from `random[r + 6 … r + 9]`);
 * within the millisecond, or when the clock went back, the counter counts
 * up, and when it runs over (past 2^32 − 1 to 0) the id borrows the next
 * millisecond, as the `uuid` package does: ids stay in the order made.
 */
export function tick(clock: IdClock, now: number, random: Uint8Array, r: number): void {
  if (now > clock.msecs) {
    let seq = (((random[r + 6] as number) & 0x7f) << 24) | ((random[r + 7] as number) << 16);
    seq |= ((random[r + 8] as number) << 8) | (random[r + 9] as number);
    clock.seq = seq;
    clock.msecs = now;
  } else {
    clock.seq = (clock.seq + 1) | 0;
    if (clock.seq === 0) clock.msecs++;
  }
}

/** The id of `clock`'s millisecond and counter, the rest from `random[r + 10 … r + 15]`. */
export function formatId(clock: IdClock, random: Uint8Array, r: number): string {
  const { msecs, seq } = clock;
  const b = bytes;
  b[0] = (msecs / 0x10000000000) & 0xff;
  b[1] = (msecs / 0x100000000) & 0xff;
  b[2] = (msecs / 0x1000000) & 0xff;
  b[3] = (msecs / 0x10000) & 0xff;
  b[4] = (msecs / 0x100) & 0xff;
  b[5] = msecs & 0xff;
  b[6] = 0x70 | ((seq >>> 28) & 0x0f);
  b[7] = (seq >>> 20) & 0xff;
  b[8] = 0x80 | ((seq >>> 14) & 0x3f);
  b[9] = (seq >>> 6) & 0xff;
  b[10] = ((seq << 2) & 0xff) | ((random[r + 10] as number) & 0x03);
  for (let i = 11; i < 16; i++) b[i] = random[r + i] as number;
  let s = "";
  for (let i = 0; i < 16; i++) {
    s += hex[b[i] as number];
    if (i === 3 || i === 5 || i === 7 || i === 9) s += "-";
  }
  return s;
}

/** Random bytes for the next ids, 16 an id; `used` of them taken. */
const pool = new Uint8Array(16 * 256);
let used = pool.length;
const clock: IdClock = { msecs: Number.NEGATIVE_INFINITY, seq: 0 };
const bytes = new Uint8Array(16);
const hex = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, "0"));
