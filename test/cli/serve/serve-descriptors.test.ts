/**
 * `runner-depot serve` under a low descriptor limit (`ulimit -n 256`; issue 30, item 3), on a
 * real process: the depot's connection cap follows the limit (three quarters of it), and once
 * idle connections leave descriptors short `/readyz` answers 503 naming the `descriptors`
 * check while `/healthz` stays 200.
 */
import { readFileSync } from "node:fs";
import { readdir, mkdtemp, rm } from "node:fs/promises";
import { request as httpRequest } from "node:http";
import { connect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleCli, spawnJsonLogged, type JsonLoggedProcess } from "../../fixtures/cli-bundle.js";

const LIMIT = 256;
const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** One GET on a connection of its own, closed after the answer (so it holds no slot afterwards). */
function getOnce(url: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { agent: false, headers: { Connection: "close" } }, (res) => {
      let body = "";
      res.setEncoding("utf8").on("data", (c: string) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode!, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

/** An idle TCP connection from `localAddress` (any of 127/8: the cap per peer address is 128). */
function idle(port: number, localAddress: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: "127.0.0.1", port, localAddress });
    socket.once("connect", () => resolve(socket));
    socket.once("error", reject);
  });
}

describe("serve under ulimit -n 256 (issue 30, item 3)", () => {
  let bundle: Awaited<ReturnType<typeof bundleCli>> | undefined;
  let dataDir: string;
  let serve: JsonLoggedProcess;
  let depotUrl: string;
  let runnerUrl: string;
  const sockets: Socket[] = [];

  beforeAll(async () => {
    bundle = await bundleCli();
    dataDir = await mkdtemp(path.join(tmpdir(), "serve-fds-"));
    serve = spawnJsonLogged(
      [bundle.file, "serve", "--data", dataDir, "--runner-port", "0", "--depot-port", "0", "--log-format", "json"],
      process.env,
      { fileLimit: LIMIT },
    );
    while (!serve.logs.some((l) => l.msg === "runner-depot serving") && serve.child.exitCode === null) await pause(100);
    const serving = serve.logs.find((l) => l.msg === "runner-depot serving");
    if (!serving) throw new Error(`serve did not start: ${JSON.stringify(serve.logs)}`);
    depotUrl = String(serving.depotUrl);
    runnerUrl = String(serving.runnerUrl);
  }, 120_000);

  afterAll(async () => {
    for (const s of sockets) s.destroy();
    if (serve?.child.exitCode === null) {
      serve.child.kill("SIGTERM");
      await serve.exited;
    }
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
    await bundle?.remove();
  });

  it("caps connections at ¾ of the limit, turns /readyz 503 on descriptors, keeps /healthz 200", async () => {
    const fds = async () => (await readdir(`/proc/${serve.child.pid}/fd`)).length;
    expect(readFileSync(`/proc/${serve.child.pid}/limits`, "utf8")).toMatch(/^Max open files\s+256\s/m);
    const ready = await getOnce(`${depotUrl}/readyz`);
    expect([ready.status, JSON.parse(ready.body).checks.descriptors]).toEqual([200, "ok"]);
    const port = Number(new URL(depotUrl).port);
    const cap = Math.floor((LIMIT * 3) / 4);

    // Far more idle connections than the cap, from 3 addresses (under the per-peer cap each).
    const opened = await Promise.all(
      Array.from({ length: 3 * 100 }, (_, i) => idle(port, `127.0.0.${2 + (i % 3)}`).catch(() => undefined)),
    );
    const closed = new Set<Socket>();
    for (const s of opened) {
      if (!s) continue;
      sockets.push(s.on("error", () => undefined).on("close", () => closed.add(s)));
      s.resume();
    }
    const live = () => sockets.filter((s) => !closed.has(s));
    // Refused ones are answered 503 and closed by the server: wait until the count holds for 1 s.
    let held = -1;
    for (let i = 0, same = 0; i < 100 && same < 10; i++) {
      await pause(100);
      same = live().length === held ? same + 1 : 0;
      held = live().length;
    }
    expect(held).toBe(cap);

    // The cap leaves a quarter of the descriptors to the rest (229 of 256 here, under the 90 %):
    // idle connections to the runner port take a few of those.
    const runnerPort = Number(new URL(runnerUrl).port);
    for (let i = 0; i < 12; i++) sockets.push((await idle(runnerPort, "127.0.0.5")).on("error", () => undefined));
    // Full: one of the depot's goes, so the probes get a (reserved) slot.
    live()[0]!.destroy();
    await pause(200);
    expect(await fds()).toBeGreaterThan((LIMIT * 9) / 10);
    const short = await getOnce(`${depotUrl}/readyz`);
    const body = JSON.parse(short.body) as { status: string; checks: Record<string, string> };
    expect(short.status).toBe(503);
    expect(body.checks.descriptors).toBe("DESCRIPTORS_SHORT");
    await pause(200);
    const health = await getOnce(`${depotUrl}/healthz`);
    expect([health.status, JSON.parse(health.body)]).toEqual([200, { status: "alive" }]);

    // The idle connections go: ready again.
    for (const s of sockets) s.destroy();
    let again = 0;
    for (let i = 0; i < 50 && again !== 200; i++) {
      await pause(100);
      again = (await getOnce(`${depotUrl}/readyz`)).status;
    }
    expect(again).toBe(200);
  }, 120_000);
});
