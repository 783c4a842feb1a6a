import { Counter, Gauge, type Registry } from "prom-client";
import type { UpkeepReading } from "../db/upkeep.js";

/** Tables /metrics names: the coordinator's own, a few dozen; more are not listed. */
const maxTables = 50;

/**
 * The database upkeep's figures (db/upkeep.ts), from its last reading (every
 * 10 s, not at scrape time): each table's live and dead rows, the age of
 * the oldest transaction holding dead rows from being removed, and the
 * vacuums the coordinator ran.
 */
export function upkeepMetrics(registers: Registry[], last: () => UpkeepReading | undefined) {
  for (const [kind, help] of [
    [
      "live",
      "Live rows of each of the coordinator's tables, as PostgreSQL's statistics count them",
    ],
    [
      "dead",
      "Dead rows of each of the coordinator's tables, not yet removed by a vacuum: claims walk past those of the task table",
    ],
  ] as const) {
    new Gauge({
      name: `meshwork_db_${kind}_rows`,
      help: `${help} (read every 10 s).`,
      labelNames: ["table"] as const,
      registers,
      collect() {
        this.reset();
        for (const t of last()?.tables.slice(0, maxTables) ?? [])
          this.set({ table: t.table }, t[kind]);
      },
    });
  }
  new Gauge({
    name: "meshwork_db_oldest_transaction_seconds",
    help: "Age of the oldest open transaction of this database that holds dead rows from being removed (0 when none; read every 10 s): past a few minutes, claims slow down as dead rows pile up.",
    registers,
    collect() {
      this.set(last()?.oldest?.seconds ?? 0);
    },
  });
  return new Counter({
    name: "meshwork_db_vacuums_total",
    help: "Vacuums the coordinator ran on its own tables (--vacuum on), by table.",
    labelNames: ["table"] as const,
    registers,
  });
}
