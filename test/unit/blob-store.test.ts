import { createHash } from "node:crypto";
import { once } from "node:events";
import {
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  statSync,
  utimesSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Readable } from "node:stream";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPostgresBlobStore } from "../../src/artifacts/blob-postgres.js";
import { type BlobStore, createFileBlobStore, leftovers } from "../../src/artifacts/blob-store.js";
import type { Database } from "../../src/db/database.js";
import { isTransientDatabaseError } from "../../src/db/faults.js";
import { rowsOf } from "../../src/db/values.js";
import { verifiedReadContract } from "../support/blob-store-contract.js";
import { engines } from "../support/engines.js";

async function* chunks(...parts: (string | Uint8Array)[]) {
  for (const p of parts) yield typeof p === "string" ? Buffer.from(p) : p;
}

const sha = (b: Uint8Array | string) => createHash("sha256").update(b).digest("hex");
const bytes = (n: number, seed = 1) =>
  Buffer.from(Uint8Array.from({ length: n }, (_, i) => (i * 31 + seed + (i >> 8)) & 0xff));

async function readAll(stream: Readable): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const part of stream) parts.push(part as Buffer);
  return Buffer.concat(parts);
}

/** A blob store under test, and what it holds besides its committed blobs. */
interface Subject {
  store: BlobStore;
  /** Temporary copies left behind: none after any finished upload. */
  leftovers(): Promise<number>;
  /** Bytes held for committed blobs (equal bytes stored twice count once). */
  stored(): Promise<number>;
  /** Flips a byte of a committed blob's stored copy behind the store's back. */
  damage(sha256: string): Promise<void>;
}

/** Bytes per chunk of the PostgreSQL store in the contract: small, so that every test crosses chunks. */
const smallChunk = 4;

async function count(database: Database, query: ReturnType<typeof sql>): Promise<number> {
  const [row] = await rowsOf<{ n: number | string }>(database.db, query);
  return Number(row?.n ?? 0);
}

const databases = new WeakMap<Subject, Database>();
/** The database a PostgreSQL subject is on. */
const postgresOf = (subject: Subject): Database => {
  const database = databases.get(subject);
  if (!database) throw new Error("not a PostgreSQL subject");
  return database;
};

function postgresSubject(database: Database, chunkBytes = smallChunk): Subject {
  const subject: Subject = {
    store: createPostgresBlobStore(database.db, { chunkBytes }),
    // Staged uploads, and chunks that belong to no upload and no blob.
    leftovers: async () =>
      (await count(database, sql`select count(*) as n from blob_uploads`)) +
      (await count(
        database,
        sql`select count(*) as n from blob_chunks c
            where not exists (select 1 from blobs b where b.upload_id = c.upload_id)
              and not exists (select 1 from blob_uploads u where u.id = c.upload_id)`,
      )),
    stored: () =>
      count(database, sql`select coalesce(sum(length(data)), 0)::bigint as n from blob_chunks`),
    async damage(sha256) {
      await database.db.execute(sql`update blob_chunks c
        set data = set_byte(c.data, 0, (get_byte(c.data, 0) + 1) % 256)
        from blobs b where b.sha256 = ${sha256} and c.upload_id = b.upload_id and c.seq = 1`);
    },
  };
  databases.set(subject, database);
  return subject;
}

function fileSubject(): Subject {
  const root = mkdtempSync(join(tmpdir(), "meshwork-blob-"));
  const size = (dir: string): number =>
    existsSync(dir)
      ? readdirSync(dir, { withFileTypes: true }).reduce(
          (n, e) =>
            n + (e.isDirectory() ? size(join(dir, e.name)) : statSync(join(dir, e.name)).size),
          0,
        )
      : 0;
  return {
    store: createFileBlobStore(root),
    leftovers: async () => (await leftovers(root)).length,
    stored: async () => size(join(root, "sha256")),
    async damage(sha256) {
      const path = join(root, "sha256", sha256.slice(0, 2), sha256.slice(2, 4), sha256);
      const b = readFileSync(path);
      b[1234] = ((b[1234] ?? 0) + 1) % 256;
      writeFileSync(path, b);
    },
  };
}

type Kind = "fs" | "postgres on pglite" | "postgres on postgres";
const kinds: Kind[] = ["fs", ...engines.map((e) => `postgres on ${e.name}` as Kind)];

/** The behaviour every blob store shares (BlobStore in src/artifacts/blob-store.ts). */
describe.each(kinds)("blob store contract: %s", (kind) => {
  let subject: Subject;
  let drop = async () => {};
  beforeAll(async () => {
    if (kind === "fs") {
      subject = fileSubject();
      return;
    }
    const engine = engines.find((e) => kind.endsWith(e.name));
    if (!engine) throw new Error(`no engine for ${kind}`);
    const opened = await engine.open();
    subject = postgresSubject(opened.database);
    drop = opened.drop;
  });
  afterAll(() => drop());

  // With chunks of 16 KiB on the PostgreSQL store (4 bytes in the rest of the contract).
  verifiedReadContract(async () =>
    kind === "fs" ? subject : postgresSubject(postgresOf(subject), 16 * 1024),
  );

  it("hashes and counts while staging, shows the bytes only after commit, and reads them back", async () => {
    const { store } = subject;
    const staged = await store.stage(chunks("hello ", "world", "!"), 100);
    expect(staged).toMatchObject({ sha256: sha("hello world!"), size: 12 });
    expect(await store.has(staged.sha256)).toBe(false);
    await staged.commit();
    expect(await store.has(staged.sha256)).toBe(true);
    expect((await readAll(store.read(staged.sha256))).toString()).toBe("hello world!");
    expect(await subject.leftovers()).toBe(0);
  });

  it("reads any range, across chunk boundaries, start and end inclusive", async () => {
    const { store } = subject;
    const data = bytes(1000, 7);
    const staged = await store.stage(chunks(data.subarray(0, 333), data.subarray(333)), 1000);
    await staged.commit();
    const ranges = [
      [0, 0],
      [0, 3],
      [3, 4],
      [4, 7],
      [2, 9],
      [5, 998],
      [997, 999],
      [999, 999],
      [0, 999],
    ] as const;
    for (const [start, end] of ranges) {
      const got = await readAll(store.read(staged.sha256, { start, end }));
      expect(got.equals(data.subarray(start, end + 1)), `${start}-${end}`).toBe(true);
    }
  });

  it("stores and reads an empty blob", async () => {
    const { store } = subject;
    const staged = await store.stage(chunks(), 10);
    expect(staged).toMatchObject({ sha256: sha(""), size: 0 });
    await staged.commit();
    expect(await store.has(sha(""))).toBe(true);
    expect((await readAll(store.read(sha("")))).length).toBe(0);
  });

  it("refuses more than maxBytes as soon as they arrive, keeping nothing", async () => {
    const { store } = subject;
    let pulled = 0;
    async function* many() {
      for (; pulled < 100; ) {
        pulled++;
        yield Buffer.from("12345");
      }
    }
    await expect(store.stage(many(), 12)).rejects.toMatchObject({
      kind: "resource_exhausted",
      reason: "ARTIFACT_TOO_LARGE",
    });
    expect(pulled).toBe(3);
    expect(await subject.leftovers()).toBe(0);
    // Exactly maxBytes is allowed.
    const staged = await store.stage(chunks("12345", "12345", "12"), 12);
    expect(staged.size).toBe(12);
    await staged.discard();
  });

  it("keeps nothing when the source fails half-way", async () => {
    const { store } = subject;
    async function* broken() {
      yield bytes(50);
      yield bytes(50);
      throw new Error("client went away");
    }
    await expect(store.stage(broken(), 1000)).rejects.toThrow("client went away");
    expect(await subject.leftovers()).toBe(0);
  });

  it("discard removes the staged bytes and commits nothing", async () => {
    const { store } = subject;
    const staged = await store.stage(chunks("never committed"), 100);
    await staged.discard();
    expect(await store.has(sha("never committed"))).toBe(false);
    expect(await subject.leftovers()).toBe(0);
  });

  it("keeps equal bytes once", async () => {
    const { store } = subject;
    const data = bytes(100, 3);
    const before = await subject.stored();
    for (const parts of [[data], [data.subarray(0, 10), data.subarray(10)]]) {
      const staged = await store.stage(chunks(...parts), 1000);
      await staged.commit();
    }
    expect(await subject.stored()).toBe(before + 100);
    expect(await subject.leftovers()).toBe(0);
    expect((await readAll(store.read(sha(data)))).equals(data)).toBe(true);
  });

  it("lets concurrent commits of the same bytes both succeed, keeping one copy", async () => {
    const { store } = subject;
    const data = bytes(64, 5);
    const before = await subject.stored();
    const staged = await Promise.all(
      Array.from({ length: 4 }, () => store.stage(chunks(data), 1000)),
    );
    await Promise.all(staged.map((s) => s.commit()));
    expect(await subject.stored()).toBe(before + 64);
    expect(await subject.leftovers()).toBe(0);
    expect((await readAll(store.read(sha(data)))).equals(data)).toBe(true);
  });

  it("returns a stream at once for a blob it does not hold, and fails on it", async () => {
    const stream = subject.store.read("0".repeat(64));
    await expect(readAll(stream)).rejects.toThrow();
  });
});

describe("file blob store", () => {
  it("removes, while running, temporary files an hour old, and keeps younger ones", async () => {
    const root = mkdtempSync(join(tmpdir(), "meshwork-blob-"));
    const store = createFileBlobStore(root);
    writeFileSync(join(root, "tmp", "crashed"), "partial");
    writeFileSync(join(root, "tmp", "live"), "partial");
    const twoHoursAgo = new Date(Date.now() - 2 * 3_600_000);
    utimesSync(join(root, "tmp", "crashed"), twoHoursAgo, twoHoursAgo);
    expect(await store.removeAbandoned?.()).toBe(1);
    expect(await leftovers(root)).toEqual(["live"]);
  });

  it("clears what a crash left in tmp/ when it starts", async () => {
    const root = mkdtempSync(join(tmpdir(), "meshwork-blob-"));
    createFileBlobStore(root);
    writeFileSync(join(root, "tmp", "half-written"), "partial");
    createFileBlobStore(root);
    expect(await leftovers(root)).toEqual([]);
  });

  it("writes under sha256/ab/cd/<hex> only on commit", async () => {
    const root = mkdtempSync(join(tmpdir(), "meshwork-blob-"));
    const store = createFileBlobStore(root);
    const staged = await store.stage(chunks("hello ", "world"), 100);
    const hex = sha("hello world");
    const path = join(root, "sha256", hex.slice(0, 2), hex.slice(2, 4), hex);
    expect(existsSync(path)).toBe(false);
    await staged.commit();
    expect(readFileSync(path, "utf8")).toBe("hello world");
  });
});

describe.each(engines)("PostgreSQL blob store on $name", (engine) => {
  let database: Database;
  let drop = async () => {};
  const mib = 1024 * 1024;
  beforeAll(async () => {
    const opened = await engine.open();
    database = opened.database;
    drop = opened.drop;
  });
  afterAll(() => drop());

  const chunkCount = () => count(database, sql`select count(*) as n from blob_chunks`);

  it("streams 64 MiB in 1 MiB chunk rows as they arrive, and reads them back a chunk at a time", async () => {
    const store = createPostgresBlobStore(database.db);
    const before = await chunkCount();
    const hash = createHash("sha256");
    const block = bytes(mib, 11);
    let behind = 0;
    async function* source() {
      for (let i = 0; i < 64; i++) {
        // Chunk i is received only once chunk i-2 is in the database: the
        // upload is written while it arrives, never held whole.
        behind = Math.max(behind, i - (await chunkCount()) + before);
        const part = Buffer.from(block);
        part.writeUInt32BE(i, 0);
        hash.update(part);
        // Sent in pieces that do not line up with the chunks.
        yield part.subarray(0, 1000);
        yield part.subarray(1000);
      }
    }
    const staged = await store.stage(source(), 64 * mib);
    expect(behind).toBeLessThanOrEqual(2);
    expect(staged).toMatchObject({ sha256: hash.digest("hex"), size: 64 * mib });
    await staged.commit();
    const [shape] = await rowsOf<{ n: number | string; max: number | string }>(
      database.db,
      sql`select count(*) as n, max(length(data)) as max from blob_chunks c
          join blobs b on b.upload_id = c.upload_id where b.sha256 = ${staged.sha256}`,
    );
    expect({ n: Number(shape?.n), max: Number(shape?.max) }).toEqual({ n: 64, max: mib });

    const stream = store.read(staged.sha256);
    // A consumer that does not read: the store reads ahead one chunk at most.
    await once(stream, "readable");
    await new Promise((r) => setTimeout(r, 300));
    expect(stream.readableLength).toBeLessThanOrEqual(2 * mib);
    const again = createHash("sha256");
    for await (const part of stream) again.update(part as Buffer);
    expect(again.digest("hex")).toBe(staged.sha256);
  });

  it("reads a range from the chunks it covers only", async () => {
    const store = createPostgresBlobStore(database.db, { chunkBytes: 10 });
    const data = bytes(100, 9);
    const staged = await store.stage(chunks(data), 100);
    await staged.commit();
    // Chunks 3 and 4 hold bytes 30..49: all others gone, the range still reads.
    await database.db.execute(
      sql`delete from blob_chunks where seq not in (3, 4)
          and upload_id = (select upload_id from blobs where sha256 = ${staged.sha256})`,
    );
    const got = await readAll(store.read(staged.sha256, { start: 35, end: 44 }));
    expect(got.equals(data.subarray(35, 45))).toBe(true);
    await expect(readAll(store.read(staged.sha256, { start: 25, end: 44 }))).rejects.toThrow(
      /chunk 2 .* is missing/,
    );
  });

  it("keeps a blob's chunk size: a store with another one reads it", async () => {
    const data = bytes(50, 13);
    const staged = await createPostgresBlobStore(database.db, { chunkBytes: 7 }).stage(
      chunks(data),
      100,
    );
    await staged.commit();
    const other = createPostgresBlobStore(database.db, { chunkBytes: 16 });
    const got = await readAll(other.read(staged.sha256, { start: 6, end: 22 }));
    expect(got.equals(data.subarray(6, 23))).toBe(true);
  });

  it("removes uploads idle past the threshold, not another replica's live upload", async () => {
    const store = createPostgresBlobStore(database.db, { chunkBytes: 4 });
    const replica = createPostgresBlobStore(database.db, {
      chunkBytes: 4,
      abandonedAfterMs: 60_000,
    });
    // A live upload, waiting for its next bytes.
    let resume = () => {};
    const gate = new Promise<void>((r) => {
      resume = r;
    });
    async function* slow() {
      yield Buffer.from("live bytes");
      await gate;
      yield Buffer.from(" and more");
    }
    const live = store.stage(slow(), 100);
    // An upload a crash abandoned two minutes ago, with its chunks.
    const dead = "d0000000-0000-4000-8000-000000000001";
    await database.db.execute(
      sql`insert into blob_uploads (id, created_at, touched_at)
          values (${dead}, now() - interval '2 minutes', now() - interval '2 minutes')`,
    );
    await database.db.execute(
      sql`insert into blob_chunks (upload_id, seq, data)
          values (${dead}, 0, '\\x0102'::bytea), (${dead}, 1, '\\x03'::bytea)`,
    );
    const liveChunks = () =>
      count(
        database,
        sql`select count(*) as n from blob_chunks c join blob_uploads u on u.id = c.upload_id
            where u.id <> ${dead}`,
      );
    for (let i = 0; i < 100 && (await liveChunks()) < 2; i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    expect(await replica.removeAbandoned()).toBe(1);
    expect(
      await count(database, sql`select count(*) as n from blob_chunks where upload_id = ${dead}`),
    ).toBe(0);
    resume();
    const staged = await live;
    await staged.commit();
    expect((await readAll(store.read(staged.sha256))).toString()).toBe("live bytes and more");
    expect(await replica.removeAbandoned()).toBe(0);
  });
  it("keeps a committed blob's bytes when its upload is discarded after the commit", async () => {
    // A commit whose answer was lost (the connection dropped after COMMIT)
    // is followed by the caller's cleanup: it must not take the bytes.
    const store = createPostgresBlobStore(database.db, { chunkBytes: 4 });
    const data = bytes(30, 21);
    const staged = await store.stage(chunks(data), 100);
    await staged.commit();
    await staged.discard();
    expect((await readAll(store.read(staged.sha256))).equals(data)).toBe(true);
    const again = await store.stage(chunks(data), 100);
    await again.commit();
    expect((await readAll(store.read(staged.sha256))).equals(data)).toBe(true);
  });

  it("keeps an upload that trickles in slower than a chunk per sweep age alive", async () => {
    const store = createPostgresBlobStore(database.db, {
      chunkBytes: 1024,
      abandonedAfterMs: 400,
    });
    async function* trickle() {
      for (let i = 0; i < 12; i++) {
        yield Buffer.from("0123456789");
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    const live = store.stage(trickle(), 1000);
    // Sweeps while it runs: bytes keep arriving, never a whole chunk.
    for (let i = 0; i < 5; i++) {
      await new Promise((r) => setTimeout(r, 120));
      expect(await store.removeAbandoned()).toBe(0);
    }
    const staged = await live;
    await staged.commit();
    expect((await readAll(store.read(staged.sha256))).length).toBe(120);
  });

  it("refuses with UPLOAD_EXPIRED, not a bare error, an upload swept while it was idle", async () => {
    const store = createPostgresBlobStore(database.db, { chunkBytes: 4, abandonedAfterMs: 100 });
    let resume = () => {};
    const gate = new Promise<void>((r) => {
      resume = r;
    });
    async function* stalled() {
      yield Buffer.from("first");
      await gate;
      yield Buffer.from("late");
    }
    const upload = store.stage(stalled(), 100);
    await new Promise((r) => setTimeout(r, 300));
    expect(await store.removeAbandoned()).toBe(1);
    resume();
    await expect(upload).rejects.toMatchObject({ kind: "aborted", reason: "UPLOAD_EXPIRED" });
  });
});

describe.skipIf(!engines.some((e) => e.name === "postgres"))(
  "PostgreSQL blob store with the database gone",
  () => {
    it("fails with a transient error that names no statement and holds no bytes", async () => {
      const engine = engines.find((e) => e.name === "postgres");
      if (!engine) return;
      const opened = await engine.open();
      const store = createPostgresBlobStore(opened.database.db);
      const staged = await store.stage(chunks("kept"), 100);
      await staged.commit();
      await opened.database.close();
      const errors: unknown[] = [];
      await store.has(staged.sha256).catch((e: unknown) => errors.push(e));
      await readAll(store.read(staged.sha256)).catch((e: unknown) => errors.push(e));
      await store.stage(chunks("secret bytes"), 100).catch((e: unknown) => errors.push(e));
      expect(errors).toHaveLength(3);
      for (const error of errors) expect(isTransientDatabaseError(error)).toBe(true);
      expect(String((errors[1] as Error).message)).not.toMatch(/select|secret/i);
      await opened.drop();
    });
  },
);
