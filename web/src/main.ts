import { describe, fleet, session, whenUnauthenticated } from "./api.js";
import { startSampling, stopSampling } from "./chart.js";
import { fill, h } from "./dom.js";
import { createPage, notFound } from "./page.js";
import { fleetPage } from "./pages/fleet.js";
import { knowledgePage } from "./pages/knowledge.js";
import { schedulesPage } from "./pages/schedules.js";
import { taskPage } from "./pages/task.js";
import { tasksPage } from "./pages/tasks.js";
import { workflowPage } from "./pages/workflow.js";

const app = document.getElementById("app") as HTMLElement;
let leave: AbortController | undefined;

/** The sign-in form; `message` says why it is shown again (a refused token). */
function signIn(message = ""): void {
  leave?.abort();
  stopSampling();
  document.title = "Sign in · Meshwork";
  const token = h("input", {
    type: "password",
    name: "token",
    id: "token",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
    placeholder: "mw_…",
  });
  const error = h(
    "p",
    { class: "signin-error", id: "signin-error", role: "alert", hidden: !message },
    message,
  );
  const submit = h("button", { class: "btn primary", type: "submit" }, "Sign in");
  const form = h(
    "form",
    { class: "signin" },
    h("h1", null, h("span", { class: "logo" }, "◆"), " Meshwork"),
    h("label", { for: "token" }, "Token"),
    token,
    error,
    submit,
    h(
      "p",
      { class: "muted" },
      "An admin or client token: ",
      h("code", null, ".meshwork/admin.token"),
      " from the first start, or one from ",
      h("code", null, "npx meshwork token create --role client"),
      ". It is kept in this tab's session storage only and sent as ",
      h("code", null, "Authorization: Bearer"),
      "; closing the tab forgets it.",
    ),
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    submit.disabled = true;
    const value = token.value.trim();
    try {
      // Checked before it is kept: a refused token never signs anyone out.
      await fleet.getFleetStatus({}, { headers: { authorization: `Bearer ${value}` } });
      session.token = value;
      // replaceState fires no hashchange: route() runs once.
      if (!location.hash || location.hash === "#/") history.replaceState(null, "", "#/fleet");
      route();
    } catch (err) {
      error.hidden = false;
      error.textContent = `That token was not accepted (${describe(err)}).`;
      submit.disabled = false;
      token.select();
    }
  });
  fill(app, form);
  token.focus();
}

whenUnauthenticated((message) => {
  session.token = "";
  signIn(`Signed out: the coordinator refused the token (${message}). Enter a valid token.`);
});

const nav = [
  { href: "#/fleet", label: "Fleet", match: /^#\/fleet/ },
  { href: "#/tasks", label: "Tasks", match: /^#\/tasks/ },
  { href: "#/schedules", label: "Schedules", match: /^#\/schedules/ },
  { href: "#/knowledge", label: "Knowledge", match: /^#\/knowledge/ },
];

/** Shows the page the hash names: #/fleet, #/tasks?state=…, #/tasks/<id>, #/tasks/<id>/workflow, #/knowledge, #/schedules. */
function route(): void {
  if (!session.token) {
    signIn();
    return;
  }
  leave?.abort();
  leave = new AbortController();
  startSampling();
  const hash = location.hash || "#/fleet";
  const [path = "", query = ""] = hash.slice(1).split("?", 2);
  const params = new URLSearchParams(query);
  const main = h("main", { id: "page" });
  const banner = h("div", { class: "banner", role: "alert", hidden: true });
  const signOut = h("button", { class: "btn ghost", type: "button", id: "sign-out" }, "Sign out");
  signOut.addEventListener("click", () => {
    session.token = "";
    signIn();
  });
  fill(
    app,
    h(
      "header",
      { class: "top" },
      h("a", { class: "brand", href: "#/fleet" }, h("span", { class: "logo" }, "◆"), " Meshwork"),
      h(
        "nav",
        null,
        ...nav.map((n) =>
          h("a", { href: n.href, class: n.match.test(hash) ? "active" : undefined }, n.label),
        ),
      ),
      h("span", { class: "spacer" }),
      h("span", { class: "muted host" }, location.host),
      signOut,
    ),
    banner,
    main,
  );
  const page = createPage(main, params, leave.signal, banner);
  const task = /^\/tasks\/([^/]+)(\/workflow)?$/.exec(path);
  if (task?.[1] && task[2]) workflowPage(page, decodeURIComponent(task[1]));
  else if (task?.[1]) taskPage(page, decodeURIComponent(task[1]));
  else if (path === "/tasks") tasksPage(page);
  else if (path === "/knowledge") knowledgePage(page);
  else if (path === "/schedules") schedulesPage(page);
  else if (path === "/fleet" || path === "" || path === "/") fleetPage(page);
  else notFound(page, `There is no page ${JSON.stringify(path.slice(0, 100))}.`);
}

window.addEventListener("hashchange", route);
route();
