import type { Schedule } from "../../../gen/meshwork/v1/schedule_pb.js";
import { schedules } from "../api.js";
import { fill, h } from "../dom.js";
import { shortId, when } from "../format.js";
import { createPager, empty, type Page, refreshMs } from "../page.js";

const pageSize = 100;

/** A schedule's row: name, cron and zone, paused, next and last run, a link to its last task. */
function row(s: Schedule, highlight: string) {
  return h(
    "tr",
    {
      "data-schedule": s.scheduleId,
      class: s.scheduleId === highlight ? "highlight" : undefined,
    },
    h("td", null, h("code", { title: s.scheduleId }, s.name)),
    h("td", null, h("code", null, s.cron), " ", h("span", { class: "muted" }, s.timeZone)),
    h("td", null, s.template?.workload ?? ""),
    h("td", null, s.paused ? h("span", { class: "pill" }, "paused") : "active"),
    h("td", null, when(s.nextRunAt)),
    h("td", null, when(s.lastRunAt)),
    h(
      "td",
      null,
      s.lastTaskId
        ? h("a", { href: `#/tasks/${encodeURIComponent(s.lastTaskId)}` }, shortId(s.lastTaskId))
        : h("span", { class: "muted" }, "—"),
    ),
  );
}

/**
 * Schedules by name (ScheduleService), pages of 100, refreshed every 3 s;
 * `?schedule=<id>` (a task page's link) highlights that schedule's row.
 */
export function schedulesPage(page: Page): void {
  page.title("Schedules");
  const highlight = page.params.get("schedule") ?? "";
  const body = h("div", { class: "panel" });
  const pager = createPager(page, { previous: "← Previous", next: "Next →" }, () => load());
  fill(page.el, h("h1", null, "Schedules"), body, pager.el);

  const load = async () => {
    const r = await schedules.listSchedules(
      { pageSize, pageToken: pager.token },
      { signal: page.signal },
    );
    pager.shown(
      r.nextPageToken,
      `${r.schedules.length} schedule${r.schedules.length === 1 ? "" : "s"}`,
    );
    fill(
      body,
      r.schedules.length
        ? h(
            "table",
            { class: "grid-table", id: "schedules" },
            h(
              "thead",
              null,
              h(
                "tr",
                null,
                ...["Name", "Cron", "Workload", "State", "Next run", "Last run", "Last task"].map(
                  (t) => h("th", null, t),
                ),
              ),
            ),
            h("tbody", null, ...r.schedules.map((s) => row(s, highlight))),
          )
        : empty(
            "No schedules yet.",
            "A schedule creates a task at each tick of a cron expression: ",
            h(
              "code",
              null,
              "npx meshwork schedule create nightly --cron '0 2 * * *' --workload report",
            ),
            ".",
          ),
    );
  };
  page.every(refreshMs, load);
}
