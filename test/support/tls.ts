import { execFileSync } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** A throwaway self-signed certificate for 127.0.0.1 (openssl), as PEM file paths. */
export function selfSignedCert(prefix: string): { cert: string; key: string } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  const [cert, key] = [join(dir, "cert.pem"), join(dir, "key.pem")];
  execFileSync(
    "openssl",
    [
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-nodes",
      "-subj",
      "/CN=localhost",
      "-addext",
      "subjectAltName=IP:127.0.0.1",
      "-days",
      "1",
      "-keyout",
      key,
      "-out",
      cert,
    ],
    { stdio: "ignore" },
  );
  return { cert, key };
}

/**
 * A throwaway self-signed certificate to present as a TLS client; as its
 * own CA, a server trusts it with `ca: cert`.
 */
export function clientCertificate(prefix: string): { cert: string; key: string } {
  return selfSignedCert(prefix);
}
