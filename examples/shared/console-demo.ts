/**
 * What the console examples share: a runner service and a depot in memory with one job
 * and one package in them, the console over both (login-URL sessions, as `serve` uses),
 * and `driveConsole`, which uses the console as a browser would. Not an example of its own.
 */
import { randomUUID } from "node:crypto";
import { createMemoryLogStore, createMemoryQueue, createMemoryStore } from "runner-depot/adapters/memory";
import { createConsole, createConsoleSessions, type Console, type ConsoleSessions } from "runner-depot/console";
import { createPackageRouter, type PackageRouter } from "runner-depot/depot";
import { createRunnerService, type RunnerService } from "runner-depot/runner";

export interface ConsoleDemo {
  runner: RunnerService;
  depot: PackageRouter;
  sessions: ConsoleSessions;
  console: Console;
  /** A job that printed two lines and is still running. */
  jobId: string;
  close(): Promise<void>;
}

/** Builds the demo: the depot under `/depot`, the console under `consoleBase`. */
export async function createConsoleDemo(consoleBase: string): Promise<ConsoleDemo> {
  const runner = createRunnerService(createMemoryQueue(), { logs: createMemoryLogStore() });
  const depot = createPackageRouter(createMemoryStore(), { base: "/depot" });
  const sessions = createConsoleSessions();
  const webConsole = createConsole({ runner, depot, depotBase: "/depot", sessions, base: consoleBase });
  const jobId = randomUUID();
  await runner.expectJob(jobId, { repoUrl: "https://git.example/demo.git", commitSha: "abc123" });
  await runner.logs.append(jobId, 0, [
    { stored: [{ line: "\u001b[32mbuilding\u001b[0m", stderr: false }], stderr: false, bytes: 17 },
    { stored: [{ line: "warning: demo", stderr: true }], stderr: true, bytes: 13 },
  ]);
  // One package, published through the depot's own API (in-process requests).
  const call = (path: string, init: RequestInit = {}) =>
    depot.fetch(new Request(`http://demo/depot${path}`, { method: "POST", ...init }));
  const opened = (await (await call("/trans/hello@1.0.0")).json()) as { transaction: string };
  await call(`/add/${opened.transaction}/file`, {
    headers: { "Pkg-Path": "bin/hello", "Pkg-Mode": "0755" },
    body: "#!/bin/sh\necho hello\n",
  });
  await call(`/commit/${opened.transaction}`);
  return {
    runner,
    depot,
    sessions,
    console: webConsole,
    jobId,
    async close() {
      await runner.close();
    },
  };
}

/**
 * Uses the console over HTTP as a browser would: signs in with a login URL, reads the
 * job list, follows the job's event stream while the job is cancelled, lists packages.
 */
export async function driveConsole(consoleUrl: string, demo: ConsoleDemo, label: string): Promise<void> {
  // The login URL's page has a "Sign in" form (a GET spends nothing); its POST opens the session.
  const loginPage = await (await fetch(`${consoleUrl}/?token=${demo.sessions.loginToken()}`)).text();
  const field = (name: string) => new RegExp(`name="${name}" value="([^"]*)"`).exec(loginPage)?.[1] ?? "";
  const login = await fetch(`${consoleUrl}/login`, {
    method: "POST",
    redirect: "manual",
    headers: { origin: new URL(consoleUrl).origin, "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ token: field("token"), next: field("next") }).toString(),
  });
  const cookie = (login.headers.get("set-cookie") ?? "").split(";")[0]!;
  console.log(`${label}: login -> ${login.status} ${login.headers.get("location")}`);
  const page = await fetch(`${consoleUrl}/jobs/${demo.jobId}`, { headers: { cookie } });
  console.log(`${label}: GET job page -> ${page.status} ${page.headers.get("content-type")}`);
  const jobs = (await (await fetch(`${consoleUrl}/api/jobs`, { headers: { cookie } })).json()) as {
    jobs: Array<{ requestId: string; status: string }>;
  };
  console.log(
    `${label}: jobs ${jobs.jobs.map((j) => `${j.requestId === demo.jobId ? "demo" : "other"}:${j.status}`).join(",")}`,
  );
  const events = await fetch(`${consoleUrl}/api/jobs/${demo.jobId}/events`, { headers: { cookie } });
  const csrf = /name="csrf-token" content="([^"]+)"/.exec(await page.text())![1]!;
  const reader = events.body!.getReader();
  let text = "";
  const decoder = new TextDecoder();
  let cancelled = false;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
    if (!cancelled && text.includes("event: lines")) {
      cancelled = true;
      const origin = new URL(consoleUrl).origin;
      const cancel = await fetch(`${consoleUrl}/api/jobs/${demo.jobId}/cancel`, {
        method: "POST",
        headers: { cookie, origin, "x-csrf-token": csrf },
      });
      console.log(`${label}: cancel -> ${cancel.status}`);
    }
  }
  const lines = [...text.matchAll(/^event: lines\nid: (\d+)\ndata: (.*)$/gm)].flatMap((m) =>
    (JSON.parse(m[2]!) as { lines: Array<[string, number]> }).lines.map((l) => l[0]),
  );
  const end = /^event: end\nid: \d+\ndata: (.*)$/m.exec(text);
  console.log(
    `${label}: streamed ${JSON.stringify(lines)} then end ${end ? (JSON.parse(end[1]!) as { outcome: string }).outcome : "missing"}`,
  );
  const packages = await fetch(`${consoleUrl}/api/packages`, { headers: { cookie } });
  console.log(`${label}: packages -> ${packages.status} ${JSON.stringify(await packages.json())}`);
  const refused = await fetch(`${consoleUrl}/api/jobs`);
  console.log(`${label}: without the session -> ${refused.status}`);
}
