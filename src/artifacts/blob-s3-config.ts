import { HeadBucketCommand, S3Client, type S3ClientConfig } from "@aws-sdk/client-s3";
import { StartupError } from "../data-dir-lock.js";
import { statusOf } from "./blob-s3-calls.js";

/**
 * The S3 client's settings from the environment: `AWS_ENDPOINT_URL_S3` or
 * `AWS_ENDPOINT_URL` (unset: AWS itself), `AWS_REGION` (default
 * `us-east-1`; `auto` for Cloudflare R2), credentials from the AWS SDK's
 * usual chain (`AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`, a profile,
 * an instance role). Path-style URLs (`endpoint/bucket/key`, what MinIO
 * and most self-hosted servers need) are on whenever an endpoint is set,
 * off for AWS; `MESHWORK_S3_FORCE_PATH_STYLE=true|false` overrides.
 * Checksums are computed only where S3 requires them: several
 * S3-compatible servers do not accept the SDK's newer default ones, and
 * the bytes are checked against their SHA-256 anyway.
 */
export function s3ClientConfig(env: NodeJS.ProcessEnv = process.env): S3ClientConfig {
  // The SDK warns, in several lines on stderr, that its releases from 2027
  // on will need Node 22. The version here is pinned: nothing to do now.
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= "true";
  const endpoint = env.AWS_ENDPOINT_URL_S3 || env.AWS_ENDPOINT_URL || undefined;
  let forcePathStyle = endpoint !== undefined;
  const pathStyle = env.MESHWORK_S3_FORCE_PATH_STYLE?.trim().toLowerCase();
  if (pathStyle) {
    if (["1", "true", "yes", "on"].includes(pathStyle)) forcePathStyle = true;
    else if (["0", "false", "no", "off"].includes(pathStyle)) forcePathStyle = false;
    else {
      throw new StartupError(
        `MESHWORK_S3_FORCE_PATH_STYLE must be true or false, not ${env.MESHWORK_S3_FORCE_PATH_STYLE}`,
      );
    }
  }
  return {
    region: env.AWS_REGION || "us-east-1",
    endpoint,
    forcePathStyle,
    requestChecksumCalculation: "WHEN_REQUIRED",
    responseChecksumValidation: "WHEN_REQUIRED",
    // A connection that cannot be made fails within seconds (and is
    // retried by the SDK); an established one that carries nothing for 30 s
    // fails too. Downloads, which idle while a slow client reads, use a
    // client of their own (createS3Clients) where the blob store's read
    // idle timeout applies instead.
    requestHandler: {
      connectionTimeout: 5000,
      socketTimeout: 30_000,
      httpAgent: { keepAlive: true, maxSockets: 256 },
      httpsAgent: { keepAlive: true, maxSockets: 256 },
    },
  };
}

/** Where an S3 client sends its requests, for messages: the endpoint's host, or AWS with the region. */
function whereOf(config: S3ClientConfig): string {
  if (typeof config.endpoint === "string") {
    try {
      return `the S3 endpoint ${new URL(config.endpoint).host}`;
    } catch {
      return "the S3 endpoint in AWS_ENDPOINT_URL";
    }
  }
  return `AWS S3 (region ${String(config.region)})`;
}

/**
 * At start-up: whether the bucket of `--blob-store s3://…` can be reached
 * with these settings (HeadBucket). Throws a StartupError, one line that
 * says what to fix, never with a key or a secret in it.
 */
export async function checkS3Bucket(
  bucket: string,
  env: NodeJS.ProcessEnv = process.env,
): Promise<void> {
  const config = s3ClientConfig(env);
  const client = new S3Client(config);
  const where = whereOf(config);
  try {
    await client.send(new HeadBucketCommand({ Bucket: bucket }));
  } catch (error) {
    let line = whyNoBucket(error, bucket, where);
    for (const secret of [env.AWS_SECRET_ACCESS_KEY, env.AWS_SESSION_TOKEN]) {
      if (secret) line = line.split(secret).join("***");
    }
    throw new StartupError(line);
  } finally {
    client.destroy();
  }
}

function whyNoBucket(error: unknown, bucket: string, where: string): string {
  const e = error as { name?: string; code?: string; message?: string };
  const first = (e.message ?? String(error)).split("\n")[0];
  const status = statusOf(error);
  if (e.name === "CredentialsProviderError") {
    return `no S3 credentials for --blob-store s3://${bucket}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY`;
  }
  switch (status) {
    case 404:
      return `the bucket ${bucket} does not exist at ${where}: create it, or fix --blob-store`;
    case 301:
      return `the bucket ${bucket} is in another region than ${where}: set AWS_REGION to its region`;
    case 400:
    case 403:
      return `${where} refused access to the bucket ${bucket} (HTTP ${status}): check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION`;
  }
  switch (e.code) {
    case "ECONNREFUSED":
      return `cannot reach ${where} (connection refused): is it running, on that port? (AWS_ENDPOINT_URL)`;
    case "ENOTFOUND":
    case "EAI_AGAIN":
      return `cannot resolve the host of ${where}: check AWS_ENDPOINT_URL`;
  }
  if (e.name === "TimeoutError") return `cannot reach ${where} (timed out): check AWS_ENDPOINT_URL`;
  return `cannot use the bucket ${bucket} at ${where}: ${e.code ?? e.name ?? "error"}${status ? ` (HTTP ${status})` : ""}: ${first}`;
}

/**
 * The S3 clients of `--blob-store s3://…`, configured from the environment
 * (`s3ClientConfig`): `client` for every call but GetObject, `readClient`
 * for GetObject, each with its own sockets, so that downloads held open by
 * slow readers never make the other calls wait for a socket. The read
 * client has no socket timeout: the blob store ends downloads idle for long.
 */
export function createS3Clients(env: NodeJS.ProcessEnv = process.env): {
  client: S3Client;
  readClient: S3Client;
} {
  const config = s3ClientConfig(env);
  return {
    client: new S3Client(config),
    readClient: new S3Client({
      ...config,
      requestHandler: { ...config.requestHandler, socketTimeout: undefined },
    }),
  };
}
