import { describe, expect, it } from "vitest";
import { type Baton, createClaimWakeups, readyCounts } from "../../src/leases/wakeup.js";

/** `n` parked claims, each recording what woke it. */
function park(
  wakeups: ReturnType<typeof createClaimWakeups>,
  n: number,
  claimer = { capabilities: ["render"], max: 1 },
) {
  /** What woke each claim (undefined: a wake-up without counts); absent while parked. */
  const woken: { baton: Baton | undefined }[] = [];
  const signal = new AbortController().signal;
  for (let i = 0; i < n; i++) {
    const armed = wakeups.arm(60_000, signal, claimer);
    void armed.fired.then((baton) => {
      woken[i] = { baton };
    });
  }
  return woken;
}

const settle = () => new Promise((r) => setTimeout(r, 0));

describe("claim wake-ups", () => {
  it("reads the counts of a NOTIFY payload, and nothing from an empty or broken one", () => {
    expect(readyCounts('{"render":500,"thumb":3}')).toEqual(
      new Map([
        ["render", 500],
        ["thumb", 3],
      ]),
    );
    expect(readyCounts("")).toBeUndefined();
    expect(readyCounts("{not json")).toBeUndefined();
  });

  it("wakes as many parked claims of the workload as tasks arrived, by their max_tasks, oldest first", async () => {
    const wakeups = createClaimWakeups();
    const single = park(wakeups, 10);
    const batch = park(wakeups, 3, { capabilities: ["render"], max: 4 });
    const other = park(wakeups, 5, { capabilities: ["thumb"], max: 1 });
    wakeups.notify(new Map([["render", 3]]));
    await settle();
    expect(single.filter(Boolean)).toHaveLength(3);
    expect(single.slice(0, 3).every(Boolean)).toBe(true);
    expect(batch.filter(Boolean)).toHaveLength(0);
    expect(other.filter(Boolean)).toHaveLength(0);
    expect(wakeups.parked()).toBe(15);
  });

  it("hands a wake-up on to the next parked claim, at most once for each claim parked when it came", async () => {
    const wakeups = createClaimWakeups();
    const woken = park(wakeups, 5);
    wakeups.notify(new Map([["render", 1]]));
    await settle();
    const baton = woken[0]?.baton;
    if (!baton) throw new Error("the oldest claim was not woken with a baton");
    // Each woken claim finds nothing (the task needs a label none has) and hands on.
    for (let i = 0; i < 10; i++) {
      wakeups.passOn(baton);
      await settle();
    }
    expect(woken.filter(Boolean)).toHaveLength(5);
    // Parked again, they are not woken by the same round.
    const again = park(wakeups, 2);
    wakeups.passOn(baton);
    await settle();
    expect(again.filter(Boolean)).toHaveLength(0);
  });

  it("wakes every parked claim without counts", async () => {
    const wakeups = createClaimWakeups();
    const a = park(wakeups, 4);
    const b = park(wakeups, 2, { capabilities: ["thumb"], max: 1 });
    wakeups.notify();
    await settle();
    expect(a.filter((x) => x && x.baton === undefined)).toHaveLength(4);
    expect(b.filter((x) => x && x.baton === undefined)).toHaveLength(2);
    expect(wakeups.parked()).toBe(0);
  });
});
