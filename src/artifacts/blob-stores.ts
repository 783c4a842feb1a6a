import type { Config } from "../config.js";
import type { Database } from "../db/database.js";
import { createPostgresBlobStore } from "./blob-postgres.js";
import { createS3BlobStore, createS3Clients } from "./blob-s3.js";
import { type BlobStore, createFileBlobStore } from "./blob-store.js";

/** The blob store `--blob-store` names (README: several replicas). */
export function createBlobStore(
  config: Pick<Config, "blobStore" | "blobDir">,
  database: Pick<Database, "kind" | "db">,
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
      // Endpoint, region and credentials from the AWS_* variables (blob-s3.ts).
      return createS3BlobStore({
        ...createS3Clients(),
        bucket: chosen.bucket,
        prefix: chosen.prefix,
      });
  }
}
