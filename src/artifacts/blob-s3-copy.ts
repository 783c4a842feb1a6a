import {
  type CompletedPart,
  CompleteMultipartUploadCommand,
  CopyObjectCommand,
  CreateMultipartUploadCommand,
  UploadPartCopyCommand,
} from "@aws-sdk/client-s3";
import type { S3Bucket } from "./blob-s3-calls.js";

/** S3's limit of parts per upload. */
export const maxParts = 10_000;

/**
 * Copies `from` to `to` on the server (a commit moving a temporary object to
 * its hash's key): one CopyObject up to `maxCopyBytes` (S3's limit, 5 GiB),
 * else UploadPartCopy in parts of `copyPartBytes` (more when 10,000 of them
 * would not hold the object). A failed copy in parts is aborted.
 */
export async function copyObject(
  s3: S3Bucket,
  from: string,
  to: string,
  size: number,
  limits: { maxCopyBytes: number; copyPartBytes: number },
): Promise<void> {
  const { client, bucket, send } = s3;
  const source = `${bucket}/${from.split("/").map(encodeURIComponent).join("/")}`;
  if (size <= limits.maxCopyBytes) {
    await send("CopyObject", () =>
      client.send(new CopyObjectCommand({ Bucket: bucket, Key: to, CopySource: source })),
    );
    return;
  }
  const partSize = Math.max(limits.copyPartBytes, Math.ceil(size / maxParts));
  const created = await send("CreateMultipartUpload", () =>
    client.send(new CreateMultipartUploadCommand({ Bucket: bucket, Key: to }), s3.deadline()),
  );
  const uploadId = created.UploadId;
  try {
    const parts: CompletedPart[] = [];
    for (let start = 0, n = 1; start < size; start += partSize, n++) {
      const end = Math.min(size, start + partSize) - 1;
      const r = await send("UploadPartCopy", () =>
        client.send(
          new UploadPartCopyCommand({
            Bucket: bucket,
            Key: to,
            UploadId: uploadId,
            PartNumber: n,
            CopySource: source,
            CopySourceRange: `bytes=${start}-${end}`,
          }),
        ),
      );
      parts.push({ PartNumber: n, ETag: r.CopyPartResult?.ETag });
    }
    await send("CompleteMultipartUpload", () =>
      client.send(
        new CompleteMultipartUploadCommand({
          Bucket: bucket,
          Key: to,
          UploadId: uploadId,
          MultipartUpload: { Parts: parts },
        }),
      ),
    );
  } catch (error) {
    await s3.abandon(to, uploadId);
    throw error;
  }
}
