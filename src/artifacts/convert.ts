import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { type Artifact, ArtifactKind, ArtifactSchema } from "../../gen/meshwork/v1/artifact_pb.js";
import type { ArtifactKindName, ArtifactRefJson, ArtifactRow } from "../db/schema/index.js";

/** The absolute download URL of an artifact: the only URI a result may name. */
export function artifactUri(publicUrl: string, id: string): string {
  return `${publicUrl}/artifacts/${id}/download`;
}

export function toArtifactRefJson(row: ArtifactRow, publicUrl: string): ArtifactRefJson {
  return {
    artifactId: row.id,
    uri: artifactUri(publicUrl, row.id),
    sha256: row.sha256,
    sizeBytes: row.sizeBytes,
    contentType: row.contentType,
  };
}

export function toArtifact(row: ArtifactRow, publicUrl: string): Artifact {
  return create(ArtifactSchema, {
    artifactId: row.id,
    uri: artifactUri(publicUrl, row.id),
    sha256: row.sha256,
    sizeBytes: BigInt(row.sizeBytes),
    contentType: row.contentType,
    taskId: row.taskId ?? "",
    attempt: row.attempt,
    workerId: row.workerId ?? "",
    filename: row.filename,
    kind: ArtifactKind[row.kind],
    createdAt: timestampFromDate(row.createdAt),
  });
}

export function kindName(kind: ArtifactKind): ArtifactKindName | undefined {
  if (kind === ArtifactKind.INPUT) return "INPUT";
  if (kind === ArtifactKind.OUTPUT) return "OUTPUT";
  if (kind === ArtifactKind.CHECKPOINT) return "CHECKPOINT";
  return undefined;
}
