import type { Config } from "../config.js";
import type { Database } from "../db/database.js";
import { createPostgresBlobStore } from "./blob-postgres.js";
import { type BlobStore, createFileBlobStore } from "./blob-store.js";

/** blob-s3.ts: loaded only with `--blob-store s3://…` (the AWS SDK is ~10 MiB resident). */
export type S3Module = typeof import("./blob-s3.js");

/** Loads blob-s3.ts when `--blob-store` names S3; otherwise nothing. */
export async function loadS3Module(
  config: Pick<Config, "blobStore">,
): Promise<S3Module | undefined> {
  return config.blobStore.kind === "s3" ? import("./blob-s3.js") : undefined;
}

/** The blob store `--blob-store` names (README: several replicas). */
export function createBlobStore(
  config: Pick<Config, "blobStore" | "blobDir">,
  database: Pick<Database, "kind" | "db">,
  s3?: S3Module,
): BlobStore {
  const chosen = config.blobStore;
  switch (chosen.kind) {
    case "fs":
      return createFileBlobStore(config.blobDir);
    case "postgres":
      if (database.kind !== "postgres") {
        throw new Error("--blob-store postgres needs a PostgreSQL database (DATABASE_URL)");
      }
      return createPostgresBlobStore(database.db);
    case "s3":
      if (!s3) throw new Error("--blob-store s3 needs blob-s3.ts loaded (loadS3Module)");
      // Endpoint, region and credentials from the AWS_* variables (blob-s3.ts).
      return s3.createS3BlobStore({
        ...s3.createS3Clients(),
        bucket: chosen.bucket,
        prefix: chosen.prefix,
      });
  }
}
