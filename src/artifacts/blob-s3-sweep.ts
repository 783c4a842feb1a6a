import {
  AbortMultipartUploadCommand,
  ListMultipartUploadsCommand,
  ListObjectsV2Command,
} from "@aws-sdk/client-s3";
import type { S3Bucket } from "./blob-s3-calls.js";

/**
 * What uploads a crash abandoned left under `<prefix>tmp/`: multipart
 * uploads begun, and temporary objects written, before `cutoff` (ms since
 * the epoch); returns how many were removed. A live upload of any replica
 * is younger: its object is written when it completes, and a multipart
 * upload within the body timeout of its last part.
 */
export async function removeAbandonedUploads(s3: S3Bucket, cutoff: number): Promise<number> {
  const { client, bucket, send } = s3;
  const tmp = `${s3.prefix}tmp/`;
  let removed = 0;
  let marker: { key?: string; upload?: string } = {};
  do {
    const page = await send("ListMultipartUploads", () =>
      client.send(
        new ListMultipartUploadsCommand({
          Bucket: bucket,
          Prefix: tmp,
          KeyMarker: marker.key,
          UploadIdMarker: marker.upload,
        }),
        s3.deadline(),
      ),
    );
    for (const u of page.Uploads ?? []) {
      if (!u.Key?.startsWith(tmp) || !u.UploadId) continue;
      if ((u.Initiated?.getTime() ?? 0) > cutoff) continue;
      await send("AbortMultipartUpload", () =>
        client.send(
          new AbortMultipartUploadCommand({ Bucket: bucket, Key: u.Key, UploadId: u.UploadId }),
          s3.deadline(),
        ),
      );
      removed++;
    }
    marker = page.IsTruncated ? { key: page.NextKeyMarker, upload: page.NextUploadIdMarker } : {};
  } while (marker.key);
  let token: string | undefined;
  do {
    const page = await send("ListObjectsV2", () =>
      client.send(
        new ListObjectsV2Command({ Bucket: bucket, Prefix: tmp, ContinuationToken: token }),
        s3.deadline(),
      ),
    );
    for (const o of page.Contents ?? []) {
      if (!o.Key?.startsWith(tmp)) continue;
      if ((o.LastModified?.getTime() ?? 0) > cutoff) continue;
      await s3.deleteObject(o.Key);
      removed++;
    }
    token = page.IsTruncated ? page.NextContinuationToken : undefined;
  } while (token);
  return removed;
}
