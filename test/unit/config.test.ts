import { describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../../src/config.js";

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
