import {
  type CompletedPart,
  CompleteMultipartUploadCommand,
  CreateMultipartUploadCommand,
  DeleteObjectCommand,
  PutObjectCommand,
  UploadPartCommand,
} from "@aws-sdk/client-s3";
import type { S3Bucket } from "./blob-s3-calls.js";

/**
 * Writes `source` to the temporary object `key` as it arrives: one
 * PutObject when it fits in one part, else a multipart upload with one part
 * in flight while the next fills (memory stays at two parts). Parts start
 * at `partBytes` and grow as nextPartBytes says. On any failure the
 * multipart upload is aborted and the object deleted (best effort), and the
 * first error is the one thrown.
 */
export async function uploadObject(
  s3: S3Bucket,
  key: string,
  source: AsyncIterable<Uint8Array>,
  partBytes: number,
): Promise<void> {
  const { client, bucket, send } = s3;
  // The size of the part being filled: doubled every 1,000 parts.
  let partSize = partBytes;
  let pending: Uint8Array[] = [];
  let pendingBytes = 0;
  let uploadId: string | undefined;
  let partCount = 0;
  const parts: CompletedPart[] = [];
  let sending: Promise<void> = Promise.resolve();
  const sendPart = async (body: Buffer) => {
    if (uploadId === undefined) {
      const created = await send("CreateMultipartUpload", () =>
        client.send(new CreateMultipartUploadCommand({ Bucket: bucket, Key: key }), s3.deadline()),
      );
      uploadId = created.UploadId;
    }
    await sending;
    const PartNumber = ++partCount;
    partSize = nextPartBytes(partBytes, partCount);
    sending = send("UploadPart", () =>
      client.send(
        new UploadPartCommand({
          Bucket: bucket,
          Key: key,
          UploadId: uploadId,
          PartNumber,
          Body: body,
          ContentLength: body.byteLength,
        }),
      ),
    ).then((r) => {
      parts.push({ PartNumber, ETag: r.ETag });
    });
    // Handled here, awaited before the next part: a failed part must not
    // surface as an unhandled rejection while the next one fills.
    sending.catch(() => {});
  };
  const takePending = () => {
    const body = Buffer.concat(pending, pendingBytes);
    pending = [];
    pendingBytes = 0;
    return body;
  };
  try {
    for await (const chunk of source) {
      let rest = chunk;
      while (rest.byteLength > 0) {
        // A full part is sent only once more bytes arrive: an upload that
        // fits in one part is one PutObject.
        if (pendingBytes === partSize) await sendPart(takePending());
        const take = Math.min(rest.byteLength, partSize - pendingBytes);
        pending.push(rest.subarray(0, take));
        pendingBytes += take;
        rest = rest.subarray(take);
      }
    }
    if (uploadId === undefined) {
      const body = takePending();
      await send("PutObject", () =>
        client.send(
          new PutObjectCommand({
            Bucket: bucket,
            Key: key,
            Body: body,
            ContentLength: body.byteLength,
          }),
        ),
      );
    } else {
      await sendPart(takePending());
      await sending;
      parts.sort((a, b) => (a.PartNumber ?? 0) - (b.PartNumber ?? 0));
      await send("CompleteMultipartUpload", () =>
        client.send(
          new CompleteMultipartUploadCommand({
            Bucket: bucket,
            Key: key,
            UploadId: uploadId,
            MultipartUpload: { Parts: parts },
          }),
        ),
      );
    }
  } catch (error) {
    // Best effort, and the first error is the one reported: the parts
    // go with the multipart upload, and the object in case a completion
    // went through without its answer arriving.
    await sending.catch(() => {});
    if (uploadId !== undefined) await s3.abandon(key, uploadId);
    await client
      .send(new DeleteObjectCommand({ Bucket: bucket, Key: key }), s3.deadline())
      .catch(() => {});
    throw error;
  }
}

/**
 * The size of the part after `sent` parts: `partBytes` for the first
 * 1,000, then doubled every 1,000 up to 512 times `partBytes` (4 GiB for
 * 8 MiB, under S3's 5 GiB per part); 10,000 parts hold 1,023,000 times
 * `partBytes`.
 */
export function nextPartBytes(partBytes: number, sent: number): number {
  return partBytes * 2 ** Math.min(9, Math.floor(sent / 1000));
}
