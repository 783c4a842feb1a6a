import { knowledge } from "../api.js";
import { fill, h } from "../dom.js";
import { when } from "../format.js";
import { createPager, empty, type Page, refreshMs } from "../page.js";

const pageSize = 100;

/** Knowledge entries, filtered by kind, pages of 100, refreshed every 3 s. */
export function knowledgePage(page: Page): void {
  page.title("Knowledge");
  const kind = page.params.get("kind") ?? "";
  const input = h("input", {
    name: "kind",
    placeholder: "Kind",
    value: kind,
    "aria-label": "Kind",
    autocomplete: "off",
  });
  const form = h(
    "form",
    { class: "filters" },
    input,
    h("button", { class: "btn", type: "submit" }, "Filter"),
    h("a", { class: "btn ghost", href: "#/knowledge" }, "Clear"),
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const v = input.value.trim();
    location.hash = v ? `#/knowledge?kind=${encodeURIComponent(v)}` : "#/knowledge";
  });
  const body = h("div", { class: "panel" });
  const pager = createPager(page, { previous: "← Previous", next: "Next →" }, () => load());
  fill(page.el, h("h1", null, "Knowledge"), form, body, pager.el);

  const load = async () => {
    const r = await knowledge.listEntries(
      { kind, pageSize, pageToken: pager.token },
      { signal: page.signal },
    );
    pager.shown(r.nextPageToken, `${r.entries.length} entr${r.entries.length === 1 ? "y" : "ies"}`);
    fill(
      body,
      r.entries.length
        ? h(
            "table",
            { class: "grid-table", id: "knowledge" },
            h(
              "thead",
              null,
              h(
                "tr",
                null,
                h("th", null, "Kind"),
                h("th", null, "Key"),
                h("th", null, "Value"),
                h("th", { class: "num" }, "Version"),
                h("th", null, "Origin"),
                h("th", null, "Updated"),
              ),
            ),
            h(
              "tbody",
              null,
              ...r.entries.map((e) => {
                const value = e.value ? JSON.stringify(e.value) : "";
                return h(
                  "tr",
                  null,
                  h(
                    "td",
                    null,
                    h("a", { href: `#/knowledge?kind=${encodeURIComponent(e.kind)}` }, e.kind),
                  ),
                  h("td", null, h("code", null, e.key)),
                  h(
                    "td",
                    { class: "value" },
                    h(
                      "code",
                      { title: value },
                      value.length > 120 ? `${value.slice(0, 120)}…` : value,
                    ),
                  ),
                  h("td", { class: "num" }, String(e.version)),
                  h("td", null, e.origin || h("span", { class: "muted" }, "—")),
                  h("td", null, when(e.updatedAt)),
                );
              }),
            ),
          )
        : kind
          ? empty(`No entries of kind “${kind}”.`, "Clear the filter to see every kind.")
          : empty(
              "No knowledge entries yet.",
              "Workers and clients write them with KnowledgeService.PutEntry; ",
              h("code", null, "npx meshwork knowledge import < entries.jsonl"),
              " or ",
              h("code", null, "knowledge sync"),
              " bring them from another coordinator.",
            ),
    );
  };
  page.every(refreshMs, load);
}
