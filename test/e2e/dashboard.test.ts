import type { ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { type Browser, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { KnowledgeService } from "../../gen/meshwork/v1/knowledge_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { DependencyPolicy, TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { TokenRole, TokenService } from "../../gen/meshwork/v1/token_pb.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { spawnServe, untilReady } from "../support/serve.js";

// The web dashboard (docs/dashboard.md) in a real browser: Debian's chromium
// driven by playwright-core against a coordinator process (auth on, as
// shipped). The test plays the worker through the RPCs and watches the
// pages follow without a reload. Screenshots go to test-output/dashboard/.

const chromiumPath = "/usr/bin/chromium";
const shots = join(process.cwd(), "test-output", "dashboard");
// Playwright's waiting locators poll; a list refreshes every 3 s.
const seen = { timeout: 20_000 };

let child: ChildProcess | undefined;
let tdb: TestDatabase | undefined;
let url = "";
let adminToken = "";

beforeAll(async () => {
  const env = { ...process.env };
  delete env.DATABASE_URL;
  if (onPostgres) {
    tdb = await createTestDatabase();
    env.DATABASE_URL = tdb.url;
  }
  const dataDir = join(mkdtempSync(join(tmpdir(), "meshwork-dashboard-")), "data");
  const served = spawnServe(["--listen", "127.0.0.1:0", "--data-dir", dataDir], env);
  child = served.child;
  const deadline = Date.now() + 60_000;
  while (!url && Date.now() < deadline) {
    url = /"url":"(https?:\/\/[^"]+)"/.exec(served.output())?.[1] ?? "";
    if (!url) await new Promise((r) => setTimeout(r, 100));
  }
  if (!url) throw new Error(`the coordinator did not start:\n${served.output()}`);
  await untilReady(url, 60_000);
  adminToken = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
}, 90_000);

afterAll(async () => {
  if (child && child.exitCode === null) {
    const exited = new Promise((r) => child?.once("exit", r));
    child.kill("SIGTERM");
    await exited;
  }
  await tdb?.drop();
});

function clients() {
  const auth: Interceptor = (next) => (req) => {
    req.header.set("authorization", `Bearer ${adminToken}`);
    return next(req);
  };
  const transport = createConnectTransport({
    baseUrl: url,
    httpVersion: "1.1",
    interceptors: [auth],
  });
  return {
    fleet: createClient(FleetService, transport),
    tasks: createClient(TaskService, transport),
    leases: createClient(LeaseService, transport),
    knowledge: createClient(KnowledgeService, transport),
    tokens: createClient(TokenService, transport),
  };
}

describe("the dashboard's files", () => {
  it("GET / answers the page, uncached, with a strict content security policy", async () => {
    const res = await fetch(`${url}/`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/html; charset=utf-8");
    expect(res.headers.get("cache-control")).toBe("no-cache");
    expect(res.headers.get("content-security-policy")).toContain("script-src 'self'");
    const html = await res.text();
    const script = /src="(\/assets\/main-[^"]+\.js)"/.exec(html)?.[1];
    const style = /href="(\/assets\/style-[^"]+\.css)"/.exec(html)?.[1];
    expect(script).toBeDefined();
    const js = await fetch(`${url}${script}`);
    expect(js.status).toBe(200);
    expect(js.headers.get("content-type")).toBe("text/javascript; charset=utf-8");
    expect(js.headers.get("cache-control")).toContain("immutable");
    const css = await fetch(`${url}${style}`);
    expect(css.headers.get("content-type")).toBe("text/css; charset=utf-8");
  });

  it("answers 404 JSON for an unknown asset and never leaves dist/web/", async () => {
    for (const path of [
      "/assets/nope.js",
      "/assets/..%2F..%2Fpackage.json",
      "/assets/%2e%2e%2findex.html",
      "/assets/",
    ]) {
      const res = await fetch(`${url}${path}`);
      expect(res.status, path).toBe(404);
      expect(await res.json(), path).toMatchObject({ error: "not_found" });
    }
    const up = await fetch(`${url}/assets/../package.json`);
    expect(up.status).not.toBe(200);
  });

  it("a client asking for JSON at / gets JSON; the RPCs and health routes are unchanged", async () => {
    const res = await fetch(`${url}/`, { headers: { accept: "application/json" } });
    expect(await res.json()).toMatchObject({ service: "meshwork", dashboard: "/" });
    expect((await fetch(`${url}/healthz`)).status).toBe(200);
    const rpc = await fetch(`${url}/meshwork.v1.FleetService/GetFleetStatus`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    expect(rpc.status).toBe(401);
  });
});

const hasChromium = existsSync(chromiumPath);
describe.skipIf(!hasChromium)(
  hasChromium
    ? "the dashboard in chromium"
    : `the dashboard in chromium (skipped: no ${chromiumPath}; apt-get install chromium)`,
  () => {
    let browser: Browser;
    let page: Page;
    const pageErrors: string[] = [];

    beforeAll(async () => {
      mkdirSync(shots, { recursive: true });
      browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox"] });
      page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
      page.on("dialog", (d) => void d.accept());
      // Uncaught exceptions and console errors (a CSP violation is one); a
      // refused call's "Failed to load resource: 401" is expected.
      page.on("pageerror", (e) => pageErrors.push(e.message));
      page.on("console", (m) => {
        if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) {
          pageErrors.push(m.text());
        }
      });
    }, 60_000);
    afterAll(async () => {
      await browser?.close();
    });

    it("refuses a wrong token on the sign-in form", async () => {
      await page.goto(`${url}/`);
      await page.locator("#token").fill("mw_not-a-real-token");
      await page.getByRole("button", { name: "Sign in" }).click();
      await expect
        .poll(() => page.locator("#signin-error").textContent(), seen)
        .toMatch(/That token was not accepted \(unauthenticated: .+\)/);
      expect(page.url()).not.toContain("mw_not-a-real-token");
      await page.screenshot({ path: join(shots, "signin-error.png") });
    });

    it("signs in, sees a worker register, a task go PENDING → RUNNING → SUCCEEDED live, cancels one, drains a worker", async () => {
      const rpc = clients();
      await page.locator("#token").fill(adminToken);
      await page.getByRole("button", { name: "Sign in" }).click();
      await page.getByText("No workers yet").waitFor(seen);
      expect(page.url()).not.toContain(adminToken);
      expect(await page.evaluate('sessionStorage.getItem("meshwork.token")')).toBe(adminToken);

      // A worker registers: the fleet page shows it without a reload.
      const { workerId } = await rpc.fleet.registerWorker({
        name: "render-1",
        capabilities: ["render", "thumbnail", "gpu"],
        labels: { zone: "eu-1" },
        maxConcurrency: 4,
      });
      await rpc.fleet.registerWorker({
        name: "render-2",
        capabilities: ["thumbnail"],
        maxConcurrency: 2,
      });
      const row = page.locator(`[data-worker-row="${workerId}"]`);
      await row.getByText("render-1").waitFor(seen);
      await row.getByText("ACTIVE").waitFor(seen);

      // A task, watched on its page while the test plays the worker.
      const { task } = await rpc.tasks.createTask({
        name: "frame-0001",
        workload: "render",
        steps: 3,
        parameters: { scene: "lobby", frame: 1 },
        correlationId: "dashboard-test",
      });
      const taskId = task?.taskId ?? "";
      await page.getByRole("navigation").getByRole("link", { name: "Tasks" }).click();
      await page.locator(`[data-task-row="${taskId}"]`).getByText("PENDING").waitFor(seen);
      await page
        .locator(`[data-task-row="${taskId}"]`)
        .getByRole("link", { name: "frame-0001" })
        .click();
      const state = page.locator("#task-state");
      await state.getByText("PENDING").waitFor(seen);

      const { claims } = await rpc.leases.claimTasks({
        workerId,
        maxTasks: 1,
        capabilities: ["render", "thumbnail", "gpu"],
      });
      const claim = claims[0];
      expect(claim?.taskId).toBe(taskId);
      if (!claim) return;
      const lease = { taskId, workerId, attempt: claim.attempt, leaseToken: claim.leaseToken };
      await rpc.leases.startTask(lease);
      await state.getByText("RUNNING").waitFor(seen);
      await page.getByText(workerId).first().waitFor(seen);
      await rpc.leases.renewLease({
        ...lease,
        progress: { completedSteps: 2, message: "encoding" },
      });
      await page.getByText("2 / 3 steps").waitFor(seen);

      const put = await fetch(`${url}/tasks/${taskId}/artifacts/frame-0001.txt`, {
        method: "PUT",
        headers: {
          authorization: `Bearer ${adminToken}`,
          "x-worker-id": workerId,
          "x-task-attempt": String(claim.attempt),
          "x-lease-token": claim.leaseToken,
          "content-type": "text/plain",
        },
        body: "rendered frame 1\n",
      });
      expect(put.status).toBe(201);
      const uploaded = (await put.json()) as {
        artifact_id: string;
        uri: string;
        sha256: string;
        size_bytes: number;
      };
      await rpc.leases.completeTask({
        ...lease,
        result: {
          artifactId: uploaded.artifact_id,
          uri: uploaded.uri,
          sha256: uploaded.sha256,
          sizeBytes: BigInt(uploaded.size_bytes),
          contentType: "text/plain",
        },
        resultSummary: "1 frame rendered",
      });
      await state.getByText("SUCCEEDED").waitFor(seen);
      await page.locator("#history").getByText("SUCCEEDED").first().waitFor(seen);
      // The history is the coordinator's (ListTaskEvents), not what this tab
      // happened to see: created, leased to the worker, succeeded; and a
      // fresh load of the page shows the same three.
      const historyShows = async () => {
        const items = page.locator("#history li");
        await items.nth(2).getByText("SUCCEEDED").waitFor(seen);
        expect(await items.count()).toBe(3);
        await items.nth(0).getByText("created").waitFor(seen);
        await items
          .nth(1)
          .getByText(`attempt 1 · worker ${workerId.slice(0, 8)}`)
          .waitFor(seen);
      };
      await historyShows();
      await page.reload();
      await historyShows();
      await page.locator("#artifacts").getByText("frame-0001.txt").waitFor(seen);
      const [download] = await Promise.all([
        page.waitForEvent("download", seen),
        page.locator("#artifacts").getByRole("button", { name: "Download" }).click(),
      ]);
      expect(download.suggestedFilename()).toBe("frame-0001.txt");
      const saved = join(shots, "download.txt");
      await download.saveAs(saved);
      expect(readFileSync(saved, "utf8")).toBe("rendered frame 1\n");
      await page.evaluate("window.scrollTo(0, 0)");
      await page.screenshot({ path: join(shots, "task.png") });

      // Cancel another task from its page; the coordinator agrees.
      const other = (await rpc.tasks.createTask({ name: "frame-0002", workload: "render" })).task;
      const otherId = other?.taskId ?? "";
      await page.goto(`${url}/#/tasks/${otherId}`);
      await state.getByText("PENDING").waitFor(seen);
      await page.locator("#cancel").click();
      await state.getByText("CANCELED").waitFor(seen);
      expect((await rpc.tasks.getTask({ taskId: otherId })).task?.state).toBe(TaskState.CANCELED);

      // One that fails for good: its error shows on its page.
      const doomed = (
        await rpc.tasks.createTask({ name: "frame-0099", workload: "render", maxAttempts: 1 })
      ).task;
      const doomedClaim = (await rpc.leases.claimTasks({ workerId, maxTasks: 1 })).claims[0];
      expect(doomedClaim?.taskId).toBe(doomed?.taskId);
      await rpc.leases.failTask({
        taskId: doomedClaim?.taskId ?? "",
        workerId,
        attempt: doomedClaim?.attempt ?? 0,
        leaseToken: doomedClaim?.leaseToken ?? "",
        errorCode: "SCENE_MISSING",
        errorMessage: "lobby.blend not found",
        retryable: false,
      });
      await page.goto(`${url}/#/tasks/${doomed?.taskId}`);
      await state.getByText("FAILED").waitFor(seen);
      // The error, in the task's fields and as the last event of its history.
      await page.locator(".error-text").getByText("lobby.blend not found").waitFor(seen);
      await page
        .locator("#history li")
        .last()
        .getByText("SCENE_MISSING: lobby.blend not found")
        .waitFor(seen);

      // More tasks, for a list worth looking at.
      for (let i = 3; i <= 8; i++) {
        await rpc.tasks.createTask({
          name: `frame-${String(i).padStart(4, "0")}`,
          workload: i % 2 ? "render" : "thumbnail",
        });
      }
      const more = await rpc.leases.claimTasks({
        workerId,
        maxTasks: 2,
        capabilities: ["render", "thumbnail", "gpu"],
      });
      for (const c of more.claims) {
        await rpc.leases.startTask({
          taskId: c.taskId,
          workerId,
          attempt: c.attempt,
          leaseToken: c.leaseToken,
        });
      }
      await page.getByRole("navigation").getByRole("link", { name: "Tasks" }).click();
      await page.locator("#tasks").getByText("frame-0008").waitFor(seen);
      await page.locator("#tasks").getByText("CANCELED").first().waitFor(seen);
      await page.screenshot({ path: join(shots, "tasks.png") });
      await page.locator("select[name=state]").selectOption("CANCELED");
      await page.locator("#tasks").getByText("frame-0002").waitFor(seen);
      await expect.poll(() => page.locator("#tasks tbody tr").count(), seen).toBe(1);

      // Paging: 55 tasks of one workload are two pages of 50 and 5, there and back.
      await rpc.tasks.createTasks({
        tasks: Array.from({ length: 55 }, (_, i) => ({ workload: "paging", name: `p-${i}` })),
      });
      await page.goto(`${url}/#/tasks?workload=paging`);
      await page.getByText("page 1 · 50 tasks").waitFor(seen);
      await page.getByRole("button", { name: "Older →" }).click();
      await page.getByText("page 2 · 5 tasks").waitFor(seen);
      expect(await page.getByRole("button", { name: "Older →" }).isDisabled()).toBe(true);
      await page.getByRole("button", { name: "← Newer" }).click();
      await page.getByText("page 1 · 50 tasks").waitFor(seen);
      expect(await page.getByRole("button", { name: "← Newer" }).isDisabled()).toBe(true);

      // Drain a worker from the fleet page.
      await page.getByRole("navigation").getByRole("link", { name: "Fleet" }).click();
      await page
        .locator(`[data-worker-row="${workerId}"]`)
        .getByRole("button", { name: "Drain" })
        .click();
      await page.locator(`[data-worker-row="${workerId}"]`).getByText("DRAINED").waitFor(seen);
      await page
        .locator(`[data-worker-row="${workerId}"]`)
        .getByRole("button", { name: "Undrain" })
        .waitFor(seen);
      expect((await rpc.fleet.getWorker({ workerId })).worker?.drained).toBe(true);
      // A second worker works through thumbnails for ~25 s while the fleet
      // page samples: the chart draws what it saw finish.
      const second = (await rpc.fleet.listWorkers({})).workers.find((w) => w.name === "render-2");
      for (let round = 0; round < 12 && second; round++) {
        await rpc.tasks.createTasks({
          tasks: [0, 1, 2].map((i) => ({ name: `thumb-${round}-${i}`, workload: "thumbnail" })),
        });
        const got = await rpc.leases.claimTasks({ workerId: second.workerId, maxTasks: 2 });
        for (const c of got.claims) {
          const l = {
            taskId: c.taskId,
            workerId: second.workerId,
            attempt: c.attempt,
            leaseToken: c.leaseToken,
          };
          await rpc.leases.startTask(l);
          await rpc.leases.completeTask({ ...l, resultSummary: "ok" });
        }
        await new Promise((r) => setTimeout(r, 2000));
      }
      await page.locator(".chart rect.bar").first().waitFor(seen);
      await page.getByText("finished per 5 s").waitFor(seen);
      await page.locator("table").getByRole("link", { name: "thumbnail" }).waitFor(seen);
      await page.screenshot({ path: join(shots, "fleet.png") });

      // Knowledge entries.
      await rpc.knowledge.putEntry({
        kind: "adaptation",
        key: "lobby/exposure",
        value: { ev: 0.7, by: "render-1" },
      });
      await rpc.knowledge.putEntry({
        kind: "pattern",
        key: "frames/slow-start",
        value: { note: "warm the cache first" },
      });
      await page.getByRole("navigation").getByRole("link", { name: "Knowledge" }).click();
      await page.locator("#knowledge").getByText("lobby/exposure").waitFor(seen);
      await page.screenshot({ path: join(shots, "knowledge.png") });

      // Sign out forgets the token.
      await page.locator("#sign-out").click();
      await page.locator("#token").waitFor(seen);
      expect(await page.evaluate('sessionStorage.getItem("meshwork.token")')).toBeNull();
    }, 180_000);

    it("shows each worker's resources, the share tree, and why a task waits", async () => {
      const rpc = clients();
      await page.goto(`${url}/`);
      await page.locator("#token").fill(adminToken);
      await page.getByRole("button", { name: "Sign in" }).click();
      await page.locator("#workers").waitFor(seen);
      const workload = `viz-${Date.now()}`;
      const { workerId } = await rpc.fleet.registerWorker({
        name: "gpu-box",
        capabilities: [workload],
        maxConcurrency: 4,
        capacity: { gpu: 2n },
      });
      const { tasks: made } = await rpc.tasks.createTasks({
        tasks: [
          { name: "fits", workload, share: "lab/viz", resources: { gpu: 1n } },
          { name: "too-big", workload, share: "lab/viz", resources: { gpu: 4n } },
        ],
      });
      await rpc.leases.claimTasks({ workerId, maxTasks: 4 });
      await page.goto(`${url}/#/fleet`);
      await page
        .locator(`[data-worker-row="${workerId}"] [data-resource="gpu"]`)
        .getByText("gpu 1 / 2")
        .waitFor(seen);
      await page.locator('#shares [data-share="lab/viz"]').waitFor(seen);
      await page.screenshot({ path: join(shots, "fleet-scheduling.png"), fullPage: true });
      await page.goto(`${url}/#/tasks/${made[1]?.taskId}`);
      await page
        .locator('#waiting [data-kind="NO_CAPACITY"]')
        .getByText("large enough")
        .waitFor(seen);
      await page.getByText("Position 1 in its share's queue.").waitFor(seen);
      await page.screenshot({ path: join(shots, "task-waiting.png"), fullPage: true });
      expect(pageErrors).toEqual([]);
      // Signed out again, as the other tests expect to find the page.
      await page.locator("#sign-out").click();
      await page.locator("#token").waitFor(seen);
    });

    it("runs tasks again and cancels them, one and a selection; not-found pages; fits a 600 px screen", async () => {
      const rpc = clients();
      await page.goto(`${url}/`);
      await page.locator("#token").fill(adminToken);
      await page.getByRole("button", { name: "Sign in" }).click();
      await page.locator("#workers").waitFor(seen);
      const workload = `bulk-${Date.now()}`;
      const { tasks: made } = await rpc.tasks.createTasks({
        tasks: ["b-1", "b-2", "b-3"].map((name) => ({ name, workload })),
      });
      const [one, two, three] = made.map((t) => t.taskId);
      await page.goto(`${url}/#/tasks?workload=${workload}`);
      // Cancel two of them as a selection.
      await page.locator(`[data-select="${one}"]`).check();
      await page.locator(`[data-select="${two}"]`).check();
      await page.locator("#cancel-selected").click();
      await page.locator("#selected-count").getByText("cancelled 2 of 2").waitFor(seen);
      await page.locator(`[data-task-row="${one}"]`).getByText("CANCELED").waitFor(seen);
      await page.locator(`[data-task-row="${three}"]`).getByText("PENDING").waitFor(seen);
      // Then run both again, the same way.
      await page.locator(`[data-select="${one}"]`).check();
      await page.locator(`[data-select="${two}"]`).check();
      await page.locator("#rerun-selected").click();
      await page.locator("#selected-count").getByText("reran 2 of 2").waitFor(seen);
      await page.locator(`[data-task-row="${two}"]`).getByText("PENDING").waitFor(seen);
      expect((await rpc.tasks.getTask({ taskId: two ?? "" })).task?.state).toBe(TaskState.PENDING);
      // Search by name narrows the list.
      await page.locator('input[name="q"]').fill("b-3");
      await page.getByRole("button", { name: "Filter" }).click();
      await page.getByText("page 1 · 1 task").waitFor(seen);

      // One task: cancel, then run it again from its page; the history says so.
      await page.goto(`${url}/#/tasks/${three}`);
      const state = page.locator("#task-state");
      await state.getByText("PENDING").waitFor(seen);
      expect(await page.locator("#rerun").count()).toBe(0); // only a finished task runs again
      await page.locator("#cancel").click();
      await state.getByText("CANCELED").waitFor(seen);
      await page.locator("#rerun").click();
      await state.getByText("PENDING").waitFor(seen);
      await page.locator("#history li").last().getByText("RERUN").waitFor(seen);

      // Routes and tasks that do not exist say so.
      await page.goto(`${url}/#/no-such-page`);
      await page.getByRole("heading", { name: "Not found" }).waitFor(seen);
      await page.goto(`${url}/#/tasks/00000000-0000-4000-8000-000000000000`);
      await page.getByText("There is no task").waitFor(seen);

      // A 600 px screen: nothing wider than it, the navigation in view.
      await page.setViewportSize({ width: 600, height: 900 });
      for (const route of [
        "#/fleet",
        `#/tasks?workload=${workload}`,
        `#/tasks/${three}`,
        `#/tasks/${three}/workflow`,
      ]) {
        await page.goto(`${url}/${route}`);
        await page.locator("main h1").first().waitFor(seen);
        await page.waitForTimeout(300);
        const width = await page.evaluate("document.documentElement.scrollWidth");
        expect(width, route).toBeLessThanOrEqual(600);
        expect(
          await page.getByRole("navigation").getByRole("link", { name: "Tasks" }).isVisible(),
        ).toBe(true);
      }
      await page.screenshot({ path: join(shots, "narrow.png"), fullPage: true });
      await page.setViewportSize({ width: 1280, height: 800 });
      await page.locator("#sign-out").click();
    }, 180_000);

    it("a token revoked or wrong in the session returns to sign-in with a clear message", async () => {
      await page.evaluate('sessionStorage.setItem("meshwork.token", "mw_revoked")');
      await page.goto(`${url}/#/fleet`);
      await expect
        .poll(() => page.locator("#signin-error").textContent(), seen)
        .toContain("refused the token");
    });

    it("offers a client token only what it may do, and shows a refusal next to the button", async () => {
      const rpc = clients();
      const { secret } = await rpc.tokens.createToken({
        name: "dashboard-viewer",
        role: TokenRole.CLIENT,
      });
      // A pushed task on a worker that is then drained: a retry finds no other worker.
      const workload = `push-${Date.now()}`;
      const { workerId } = await rpc.fleet.registerWorker({
        name: "push-1",
        capabilities: [workload],
        apiBaseUrl: "http://127.0.0.1:1/push-1",
      });
      const pushed = (await rpc.tasks.createTask({ name: "pushed", workload })).task?.taskId ?? "";
      await rpc.tasks.scheduleTask({ taskId: pushed });
      await rpc.fleet.drainWorker({ workerId, drained: true });
      const viewer = await browser.newPage({ viewport: { width: 1280, height: 800 } });
      viewer.on("dialog", (d) => void d.accept());
      try {
        await viewer.goto(`${url}/`);
        await viewer.locator("#token").fill(secret);
        await viewer.getByRole("button", { name: "Sign in" }).click();
        await viewer.locator(`[data-worker-row="${workerId}"]`).waitFor(seen);
        // Draining is an admin's: a client token is not offered it.
        await viewer.waitForTimeout(500);
        expect(await viewer.locator("#workers button").count()).toBe(0);
        await viewer.goto(`${url}/#/tasks/${pushed}`);
        await viewer.locator("#task-state").getByText("ASSIGNED").waitFor(seen);
        await viewer.locator("#retry").click();
        const refusal = viewer.locator("#retry + .refusal[role=alert]");
        await refusal.getByText("failed_precondition:").waitFor(seen);
        expect(await refusal.textContent()).not.toMatch(/\bat \S+:\d+/);
        await viewer.screenshot({ path: join(shots, "refused.png") });
      } finally {
        await viewer.close();
        await rpc.tasks.cancelTask({ taskId: pushed });
      }
    });

    it("draws a task's workflow graph with its states, live, and shows the workflow fields", async () => {
      const rpc = clients();
      await page.goto(`${url}/`);
      await page.locator("#token").fill(adminToken);
      await page.getByRole("button", { name: "Sign in" }).click();
      await page.locator("#sign-out").waitFor(seen);
      const workload = `wf-${Date.now()}`;
      const { workerId } = await rpc.fleet.registerWorker({
        name: "wf-1",
        capabilities: [workload],
        maxConcurrency: 4,
      });
      // extract → resize, caption → publish (ALL_DONE) → archive
      const { tasks: made } = await rpc.tasks.createTasks({
        tasks: [
          { ref: "extract", name: "extract frames", workload },
          { ref: "resize", name: "resize", workload, dependsOn: ["ref:extract"] },
          { ref: "caption", name: "caption", workload, maxAttempts: 1, dependsOn: ["ref:extract"] },
          {
            ref: "publish",
            name: "publish",
            workload,
            dependsOn: ["ref:resize", "ref:caption"],
            dependencyPolicy: DependencyPolicy.ALL_DONE,
            timeoutSeconds: 600,
          },
          { ref: "archive", name: "archive", workload, dependsOn: ["ref:publish"] },
        ],
      });
      const id = Object.fromEntries(made.map((t) => [t.ref, t.taskId]));
      const claim = async (n: number) => {
        const got = (await rpc.leases.claimTasks({ workerId, maxTasks: n })).claims;
        const leases = got.map((c) => ({
          taskId: c.taskId,
          workerId,
          attempt: c.attempt,
          leaseToken: c.leaseToken,
        }));
        for (const l of leases) await rpc.leases.startTask(l);
        return leases;
      };
      // extract succeeds with an output artifact and a result value.
      const [extract] = await claim(1);
      expect(extract?.taskId).toBe(id.extract);
      if (!extract) return;
      const put = await fetch(`${url}/tasks/${id.extract}/artifacts/frames.tar`, {
        method: "PUT",
        headers: {
          authorization: `Bearer ${adminToken}`,
          "x-worker-id": workerId,
          "x-task-attempt": String(extract.attempt),
          "x-lease-token": extract.leaseToken,
        },
        body: "frames",
      });
      expect(put.status).toBe(201);
      await rpc.leases.completeTask({ ...extract, resultValue: { frames: 3, format: "tar" } });
      // resize runs; caption fails for good.
      const second = await claim(2);
      const resize = second.find((l) => l.taskId === id.resize);
      const caption = second.find((l) => l.taskId === id.caption);
      expect(resize && caption).toBeTruthy();
      if (!resize || !caption) return;
      await rpc.leases.failTask({
        ...caption,
        errorCode: "NO_FONT",
        errorMessage: "font missing",
        retryable: false,
      });

      // From publish's task page to its workflow.
      await page.goto(`${url}/#/tasks/${id.publish}`);
      await page.locator("#task-state").getByText("PENDING").waitFor(seen);
      await page.locator("#dependencies-pending").getByText("1 of 2").waitFor(seen);
      expect(await page.locator("#depends-on a").count()).toBe(2);
      await page.getByText("ALL_DONE").waitFor(seen);
      await page.getByText("10 min per attempt").waitFor(seen);
      await page.screenshot({ path: join(shots, "task-workflow-fields.png"), fullPage: true });
      await page.locator("#workflow-link").click();
      const node = (ref: string) => page.locator(`[data-node="${id[ref]}"]`);
      await node("archive").waitFor(seen);
      expect(await page.locator("#workflow-graph [data-node]").count()).toBe(5);
      expect(await page.locator("#workflow-graph [data-edge]").count()).toBe(5);
      for (const [from, to] of [
        ["extract", "resize"],
        ["extract", "caption"],
        ["resize", "publish"],
        ["caption", "publish"],
        ["publish", "archive"],
      ] as const) {
        await page
          .locator(`[data-edge="${id[from]}>${id[to]}"]`)
          .waitFor({ ...seen, state: "attached" });
      }
      const states = {
        extract: "SUCCEEDED",
        resize: "RUNNING",
        caption: "FAILED",
        publish: "PENDING",
      };
      for (const [ref, state] of Object.entries(states)) {
        expect(await node(ref).getAttribute("data-state"), ref).toBe(state);
      }
      expect(await node("publish").getAttribute("class")).toContain("current");
      await node("publish").getByText("PENDING · waits for 1").waitFor(seen);
      await page.locator('[data-count-state="PENDING"] strong').getByText("2").waitFor(seen);
      await page.locator('[data-count-state="FAILED"] strong').getByText("1").waitFor(seen);
      expect(await page.locator("#workflow-cut").isHidden()).toBe(true);
      await page.screenshot({ path: join(shots, "workflow.png") });

      // Live: resize finishes, the graph follows without a reload.
      await rpc.leases.completeTask({ ...resize, resultSummary: "ok" });
      await page.locator(`[data-node="${id.resize}"][data-state="SUCCEEDED"]`).waitFor(seen);
      await node("publish")
        .getByText(/^PENDING$/)
        .waitFor(seen);

      // A node opens its task: extract's result value; resize's dependency outputs.
      await node("extract").click();
      await page.locator("#task-state").getByText("SUCCEEDED").waitFor(seen);
      expect(page.url()).toContain(`#/tasks/${id.extract}`);
      await page.locator("#result-value").getByText('"frames": 3').waitFor(seen);
      await page.goto(`${url}/#/tasks/${id.resize}`);
      await page.locator('[data-output="extract/frames.tar"]').waitFor(seen);
      await page.locator("#sign-out").click();
      await page.locator("#token").waitFor(seen);
    }, 120_000);

    it("raised no error in the page", () => {
      expect(pageErrors).toEqual([]);
    });
  },
);
