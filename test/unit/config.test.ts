import { describe, expect, it } from "vitest";
import { ConfigError, loadConfig, shownUrl } from "../../src/config.js";

describe("--retention", () => {
  const day = 86_400_000;

  it("defaults to 7 days; 0 keeps finished tasks forever", () => {
    expect(loadConfig([], {}).retentionMs).toBe(7 * day);
    expect(loadConfig(["--retention", "0"], {}).retentionMs).toBe(0);
    expect(loadConfig([], { MESHWORK_RETENTION: "0" }).retentionMs).toBe(0);
  });

  it("takes seconds, minutes, hours and days, the flag before the environment", () => {
    expect(loadConfig(["--retention", "90s"], {}).retentionMs).toBe(90_000);
    expect(loadConfig(["--retention", "30m"], {}).retentionMs).toBe(30 * 60_000);
    expect(loadConfig([], { MESHWORK_RETENTION: "12h" }).retentionMs).toBe(12 * 3_600_000);
    expect(loadConfig(["--retention", "30d"], { MESHWORK_RETENTION: "1h" }).retentionMs).toBe(
      30 * day,
    );
  });

  it("refuses anything else with one message naming the flag", () => {
    for (const bad of ["7", "7w", "-1d", "1.5h", "0d", "d", "7 d", "36501d", "1e3s"]) {
      expect(() => loadConfig([`--retention=${bad}`], {})).toThrow(ConfigError);
      expect(() => loadConfig([`--retention=${bad}`], {})).toThrow(
        `--retention must be 0 or a whole number with a unit, s, m, h or d (30m, 12h, 7d), up to 36500d, not ${bad}`,
      );
    }
  });
});

describe("observability flags", () => {
  it("--log-format defaults to auto and takes json or pretty, from the flag or MESHWORK_LOG_FORMAT", () => {
    expect(loadConfig([], {}).logFormat).toBe("auto");
    expect(loadConfig(["--log-format", "json"], {}).logFormat).toBe("json");
    expect(loadConfig([], { MESHWORK_LOG_FORMAT: "pretty" }).logFormat).toBe("pretty");
    expect(() => loadConfig(["--log-format", "yaml"], {})).toThrow(
      "--log-format yaml is not one of auto|json|pretty",
    );
  });

  it("--metrics-public is off unless on", () => {
    expect(loadConfig([], {}).metricsPublic).toBe(false);
    expect(loadConfig(["--metrics-public", "on"], {}).metricsPublic).toBe(true);
    expect(loadConfig([], { MESHWORK_METRICS_PUBLIC: "on" }).metricsPublic).toBe(true);
    expect(() => loadConfig(["--metrics-public", "yes"], {})).toThrow(ConfigError);
  });

  it("--vacuum is on unless off", () => {
    expect(loadConfig([], {}).vacuum).toBe(true);
    expect(loadConfig(["--vacuum", "off"], {}).vacuum).toBe(false);
    expect(loadConfig([], { MESHWORK_VACUUM: "off" }).vacuum).toBe(false);
    expect(() => loadConfig(["--vacuum", "sometimes"], {})).toThrow("--vacuum must be on or off");
  });

  it("--otel-endpoint is empty unless set, from the flag or OTEL_EXPORTER_OTLP_ENDPOINT; only http(s)", () => {
    expect(loadConfig([], {}).otelEndpoint).toBe("");
    expect(loadConfig(["--otel-endpoint", "http://127.0.0.1:4318/"], {}).otelEndpoint).toBe(
      "http://127.0.0.1:4318",
    );
    expect(
      loadConfig([], { OTEL_EXPORTER_OTLP_ENDPOINT: "https://otel.example:4318" }).otelEndpoint,
    ).toBe("https://otel.example:4318");
    // A full traces URL is taken as its base (the exporter adds /v1/traces).
    expect(loadConfig(["--otel-endpoint", "http://c:4318/v1/traces"], {}).otelEndpoint).toBe(
      "http://c:4318",
    );
    expect(shownUrl("https://user:secret@c:4318")).toBe("https://c:4318");
    for (const bad of ["127.0.0.1:4318", "grpc://x:4317", "not a url"]) {
      expect(() => loadConfig(["--otel-endpoint", bad], {})).toThrow(
        "--otel-endpoint (OTEL_EXPORTER_OTLP_ENDPOINT) must be an http(s) URL",
      );
    }
  });
});

describe("the scheduling flags", () => {
  it("default to the token's share, a 5 min half-life, reservations after 30 s and no KEDA listener", () => {
    expect(loadConfig([], {})).toMatchObject({
      defaultShare: "",
      shareHalfLifeMs: 300_000,
      reserveAfterMs: 30_000,
      kedaListen: "",
      kedaClientCa: "",
    });
  });

  it("take a share path, durations and a listen address, from flags or the environment", () => {
    expect(
      loadConfig(
        ["--default-share", "lab/shared", "--share-half-life", "1h", "--reserve-after", "0"],
        {
          MESHWORK_KEDA_LISTEN: "127.0.0.1:9090",
        },
      ),
    ).toMatchObject({
      defaultShare: "lab/shared",
      shareHalfLifeMs: 3_600_000,
      reserveAfterMs: 0,
      kedaListen: "127.0.0.1:9090",
    });
  });

  it("refuse a zero half-life, a bad KEDA address, and a client CA without TLS", () => {
    expect(() => loadConfig(["--share-half-life", "0"], {})).toThrow("--share-half-life");
    expect(() => loadConfig(["--keda-listen", "nowhere"], {})).toThrow(ConfigError);
    expect(() =>
      loadConfig(["--keda-listen", "127.0.0.1:9090", "--keda-client-ca", "ca.pem"], {}),
    ).toThrow("--keda-client-ca needs --keda-listen and a server certificate");
  });
});
