/**
 * Soak: the depot's 20-second mixed load with 1,000 stalled connections open beside it
 * (issue 9). The depot (servePackageRouter over an fs store with fsync, in a child
 * process) gets the same mixed load twice: alone, then with 1,000 hostile connections kept
 * open throughout — a third send nothing, a third send headers a byte at a time, a third
 * start an upload and stall its body. Each one the server cuts (408 at the header or body
 * deadline) is replaced at once, so about 1,000 stay open. Normal clients must still be
 * served (0 failures) and their p99 is stated for both runs; at the end no upload temp
 * file is left and the server's descriptors are back down. `scale` multiplies the stalled
 * count, the duration and the deadlines (CI: 0.1 → 100 connections, 2 s, 1 s deadlines);
 * a run in which the deadlines cut no stalled connection did not hold (it tested nothing).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
// The same depot process the tests measure (quiet: this soak provokes timeouts on purpose).
const serverScript = path.join(here, "..", "test", "fixtures", "depot-client-server.ts");
const STALLED = 1_000;
const LOAD_MS = 20_000;
const WORKERS = 8;
/**
 * Deadlines short enough that stalled connections are cut and replaced during the run:
 * 5 s at full size; scaled with the run (at least 1 s), so CI's 2-second tenth cuts some too.
 */
function serverOptions(scale: number) {
  const deadline = Math.max(1_000, Math.round(5_000 * scale));
  return { headersTimeoutMs: deadline, bodyIdleMs: deadline, keepAliveTimeoutMs: deadline, maxConnections: 2_000 };
}
type ServerOptions = ReturnType<typeof serverOptions>;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const percentile = (xs: number[], p: number) => {
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted.length === 0 ? NaN : sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
};
const fmt = (n: number, digits = 1) => n.toFixed(digits);

async function startDepot(
  dir: string,
  options: ServerOptions,
): Promise<{ url: string; port: number; pid: number; child: ChildProcess }> {
  const child = spawn(process.execPath, ["--import", "tsx", serverScript, dir, "--quiet", JSON.stringify(options)], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const line = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).once("line", resolve);
    child.once("exit", (code) => reject(new Error(`depot server exited with ${code}`)));
  });
  const { url, pid } = JSON.parse(line) as { url: string; pid: number };
  return { url, port: Number(new URL(url).port), pid, child };
}

async function openFds(pid: number): Promise<number> {
  return (await readdir(`/proc/${pid}/fd`).catch(() => [])).length;
}

async function publish(url: string, name: string, version: string, body: Uint8Array): Promise<void> {
  const opened = await fetch(`${url}/trans/${name}@${version}`, { method: "POST" });
  if (opened.status !== 201) throw new Error(`open: ${opened.status}`);
  const { transaction } = (await opened.json()) as { transaction: string };
  const added = await fetch(`${url}/add/${transaction}/file`, {
    method: "POST",
    headers: { "Pkg-Path": "payload.bin" },
    body: body as BodyInit,
  });
  if (added.status !== 201) throw new Error(`add: ${added.status}`);
  await added.arrayBuffer();
  const committed = await fetch(`${url}/commit/${transaction}`, { method: "POST" });
  if (committed.status !== 201) throw new Error(`commit: ${committed.status}`);
  await committed.arrayBuffer();
}

interface LoadResult {
  latencies: number[];
  /** Latencies of the read requests only (catalog, version, data). */
  reads: number[];
  failures: string[];
  byKind: Record<string, number>;
}

/** WORKERS loops of catalog, version, download (whole and Range) and publish requests for `ms`. */
async function mixedLoad(url: string, ms: number, tag: string): Promise<LoadResult> {
  const result: LoadResult = { latencies: [], reads: [], failures: [], byKind: {} };
  const end = Date.now() + ms;
  let published = 0;
  const expect = async (kind: string, run: () => Promise<Response>, status: number) => {
    const start = performance.now();
    try {
      const response = await run();
      await response.arrayBuffer();
      if (response.status !== status) result.failures.push(`${kind}: ${response.status}`);
    } catch (error) {
      result.failures.push(`${kind}: ${(error as Error).message}`);
    }
    const ms = performance.now() - start;
    result.latencies.push(ms);
    result.reads.push(ms);
    result.byKind[kind] = (result.byKind[kind] ?? 0) + 1;
  };
  await Promise.all(
    Array.from({ length: WORKERS }, async (_, worker) => {
      for (let i = 0; Date.now() < end; i++) {
        const pick = (i * 7 + worker) % 20;
        const pkg = `seed-${(i + worker) % 10}`;
        if (pick < 7) await expect("GET /catalog", () => fetch(`${url}/catalog`), 200);
        else if (pick < 10) await expect("GET /version", () => fetch(`${url}/version/${pkg}`), 200);
        else if (pick < 14) await expect("GET /data", () => fetch(`${url}/data/${pkg}@1.0.0`), 200);
        else if (pick < 17)
          await expect(
            "GET /data + Range",
            () => fetch(`${url}/data/${pkg}@1.0.0`, { headers: { Range: "bytes=100-70000" } }),
            206,
          );
        else {
          const start = performance.now();
          const version = `1.0.${published++}`;
          try {
            await publish(url, `load-${tag}-${worker}`, version, randomBytes(4096));
          } catch (error) {
            result.failures.push(`publish: ${(error as Error).message}`);
          }
          result.latencies.push(performance.now() - start);
          result.byKind.publish = (result.byKind.publish ?? 0) + 1;
        }
      }
    }),
  );
  return result;
}

interface StallStats {
  opened: number;
  cutWith408: number;
  cutOther: number;
  refused: number;
}

/** Keeps `count` hostile connections open until `stop()`, replacing each one the server cuts. */
function holdStalled(
  port: number,
  count: number,
  transactions: string[],
): { stats: StallStats; stop(): Promise<void>; ready: Promise<void> } {
  const stats: StallStats = { opened: 0, cutWith408: 0, cutOther: 0, refused: 0 };
  const sockets = new Set<net.Socket>();
  let stopping = false;
  const open = (slot: number): Promise<void> =>
    new Promise((resolve) => {
      const socket = net.connect(port, "127.0.0.1");
      sockets.add(socket);
      let reply = "";
      let trickle: NodeJS.Timeout | undefined;
      socket.on("connect", () => {
        stats.opened++;
        resolve();
        const kind = slot % 3;
        if (kind === 1) {
          const request = `GET /catalog HTTP/1.1\r\nHost: x\r\nX-Slow: ${"s".repeat(4000)}\r\n\r\n`;
          let at = 0;
          trickle = setInterval(() => {
            if (!socket.destroyed) socket.write(request[at++ % request.length]!);
          }, 1000);
        } else if (kind === 2) {
          const id = transactions[slot % transactions.length]!;
          socket.write(
            `POST /add/${id}/file HTTP/1.1\r\nHost: x\r\nPkg-Path: stalled-${slot}-${stats.opened}.bin\r\nContent-Length: 1000000\r\n\r\n`,
          );
          socket.write(Buffer.alloc(20_000, 7));
        }
      });
      socket.on("data", (chunk) => (reply += chunk.toString("latin1")));
      socket.on("error", () => resolve());
      socket.on("close", () => {
        if (trickle) clearInterval(trickle);
        sockets.delete(socket);
        if (/^HTTP\/1\.1 408 /.test(reply)) stats.cutWith408++;
        else if (/^HTTP\/1\.1 503 /.test(reply)) stats.refused++;
        else if (!stopping) stats.cutOther++;
        if (!stopping) void open(slot);
      });
    });
  const ready = (async () => {
    for (let slot = 0; slot < count; slot += 50)
      await Promise.all(Array.from({ length: Math.min(50, count - slot) }, (_, i) => open(slot + i)));
  })();
  return {
    stats,
    ready,
    async stop() {
      stopping = true;
      for (const socket of sockets) socket.destroy();
      await sleep(200);
    },
  };
}

/** Runs the soak and returns its Markdown section. */
export async function run(options: { scale?: number } = {}): Promise<string> {
  const scale = options.scale ?? 1;
  const stalledCount = Math.max(10, Math.round(STALLED * scale));
  const loadMs = Math.max(2_000, Math.round(LOAD_MS * scale));
  const deadlines = serverOptions(scale);
  const work = await mkdtemp(path.join(os.tmpdir(), "soak-depot-stalled-"));
  const storeDir = path.join(work, "store");
  let depot: Awaited<ReturnType<typeof startDepot>> | undefined;
  try {
    depot = await startDepot(storeDir, deadlines);
    for (let i = 0; i < 10; i++) await publish(depot.url, `seed-${i}`, "1.0.0", randomBytes(256 * 1024));
    const fdsIdle = await openFds(depot.pid);

    const alone = await mixedLoad(depot.url, loadMs, "alone");

    // Transactions the stalled uploads post into (an upload needs an open transaction).
    const transactions: string[] = [];
    for (let i = 0; i < 20; i++) {
      const response = await fetch(`${depot.url}/trans/stall-${i}@1.0.0`, { method: "POST" });
      transactions.push(((await response.json()) as { transaction: string }).transaction);
    }
    const stalled = holdStalled(depot.port, stalledCount, transactions);
    await stalled.ready;
    const fdsStalled = await openFds(depot.pid);
    const beside = await mixedLoad(depot.url, loadMs, "beside");
    const fdsEnd = await openFds(depot.pid);
    const { stats } = stalled;
    await stalled.stop();
    await sleep(deadlines.bodyIdleMs + 1_000);
    // Upload temp files only: the store's lock owner files (`owner-…`) live in tmp/ too.
    const tmpLeft = (await readdir(path.join(storeDir, "tmp"))).filter((name) => !name.startsWith("owner-")).length;
    const fdsAfter = await openFds(depot.pid);

    // The deadlines must have cut stalled connections: a run where none was cut tested nothing.
    const ok = beside.failures.length === 0 && alone.failures.length === 0 && tmpLeft === 0 && stats.cutWith408 > 0;
    const row = (label: string, r: LoadResult, fds: string) =>
      `| ${label} | ${r.latencies.length} | ${r.failures.length} | ${fmt(percentile(r.latencies, 50))} | ${fmt(percentile(r.latencies, 99))} | ${fmt(percentile(r.reads, 99))} | ${fmt(Math.max(...r.latencies))} | ${fds} |`;
    return [
      "## Depot: mixed load beside stalled connections",
      "",
      `Method: \`servePackageRouter\` over \`createFsStore\` (fsync on) in a child process, deadlines ${JSON.stringify(deadlines)}. ${WORKERS} workers run a mixed load for ${loadMs / 1000} s (35% \`GET /catalog\`, 15% \`GET /version\`, 20% \`GET /data\` of a 256 KiB package, 15% the same with \`Range\`, 15% a publish of a 4 KiB one-file package: open, add, commit, counted as one operation), first alone, then with ${stalledCount.toLocaleString("en")} stalled connections held open beside it (a third silent, a third sending headers one byte a second, a third with an upload body stalled after 20 KB; each one the server cuts is replaced at once). Latencies are per operation, in ms, measured by the client.`,
      "",
      "| run | operations | failures | p50 ms | p99 ms | p99 ms of reads | max ms | server fds |",
      "|---|---:|---:|---:|---:|---:|---:|---|",
      row("alone", alone, `${fdsIdle}`),
      row(`beside ${stalledCount.toLocaleString("en")} stalled`, beside, `${fdsStalled} at start, ${fdsEnd} at end`),
      "",
      `Stalled connections: ${stats.opened.toLocaleString("en")} opened in all; ${stats.cutWith408.toLocaleString("en")} cut by the server with 408 \`REQUEST_TIMEOUT\` (header or body deadline) and replaced, ${stats.refused} refused with 503, ${stats.cutOther} closed otherwise. After they closed: ${tmpLeft} upload temp files left, ${fdsAfter} server descriptors (${fdsIdle} before the load). Failures beside the stalled connections: ${beside.failures.length}${beside.failures.length ? ` (${[...new Set(beside.failures)].slice(0, 5).join("; ")})` : ""}. Result: ${ok ? "**held**" : "**did not hold**"}.`,
    ].join("\n");
  } finally {
    if (depot && depot.child.exitCode === null) {
      const exited = new Promise((resolve) => depot!.child.once("exit", resolve));
      depot.child.kill("SIGTERM");
      await exited;
    }
    await rm(work, { recursive: true, force: true });
  }
}
