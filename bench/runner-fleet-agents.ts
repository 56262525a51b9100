/**
 * Child process of bench/runner-fleet.ts: runs many agents, each a createRunnerClient with its
 * own HTTP/2 connection, writing lines at its own rate for the run's duration, then sending its
 * job end. One interval timer per process drives every agent (lines due are written each tick).
 * A line is `<seq> <epoch ms> <padding>`, 40 to 200 bytes, so the server can time it and check
 * order. IPC out: `"ready"` once loaded; in: `{ port, secret, jobs: { id, rate, startMs }[], durationMs }`; out: `{ sent: { id, lines }[], failed, calls, … }`.
 */
import { readFileSync } from "node:fs";
import http2 from "node:http2";
import { createRunnerClient } from "../src/runner/client/runner-client.js";
import type { RunnerClient } from "../src/runner/client/runner-client.js";
import { mintJobToken } from "../src/runner/protocol/token.js";

interface Job {
  id: string;
  /** Lines per second. */
  rate: number;
  /** Start, ms after the run began (a staggered ramp). */
  startMs: number;
}

/** Time this process was runnable but waiting for a CPU (Linux schedstat), ms. */
function runQueueMs(): number {
  try {
    return Number(readFileSync("/proc/self/schedstat", "utf8").split(" ")[1]) / 1e6;
  } catch {
    return NaN;
  }
}

/** BENCH_FLEET_MAX_CALL_MS: the agents' maxCallMs (default the client's), to measure the cost of a call's cut. */
const MAX_CALL_MS = process.env.BENCH_FLEET_MAX_CALL_MS ? Number(process.env.BENCH_FLEET_MAX_CALL_MS) : undefined;
const PAD = "abcdefghijklmnopqrstuvwxyz0123456789 ".repeat(6);
const TICK_MS = 50;

function line(seq: number): string {
  const head = `${seq} ${(performance.timeOrigin + performance.now()).toFixed(3)} `;
  // 40 to 200 bytes, varying line to line as build output does.
  const length = 40 + ((seq * 7919) % 161);
  return head + PAD.slice(0, Math.max(0, length - head.length));
}

/**
 * A probe: one extra HTTP/2 connection per agent process that only pings the server every
 * 500 ms, so the report shows how long the server takes to answer a PING under the load
 * (the agents' keep-alive gives up after its keepaliveMs, 20 s by default).
 */
function pingProbe(endpoint: string): { stop(): number[] } {
  const rtts: number[] = [];
  const s = http2.connect(endpoint);
  s.on("error", () => undefined);
  let outstanding = 0;
  const timer = setInterval(() => {
    if (s.destroyed || outstanding > 5) return;
    outstanding++;
    const t0 = performance.now();
    try {
      s.ping((err) => {
        outstanding--;
        if (err === null) rtts.push(performance.now() - t0);
      });
    } catch {
      outstanding--;
    }
  }, 500);
  return {
    stop() {
      clearInterval(timer);
      s.destroy();
      return rtts;
    },
  };
}

process.send?.("ready");
process.once("message", async (msg: { port: number; secret: string; jobs: Job[]; durationMs: number }) => {
  const endpoint = `http://127.0.0.1:${msg.port}`;
  const agents = msg.jobs.map((job) => ({ job, client: null as RunnerClient | null, sent: 0, due: 0 }));
  const probe = pingProbe(endpoint);
  const t0 = performance.now();
  let failed = 0;
  let lag = 0;
  // Retries are part of the figures: a server that refuses calls under load shows here.
  const retries = new Map<string, number>();
  // By the job's rate too: does a retry hit the quiet jobs or the loud ones?
  const onRetry = (rate: number) => (error: Error) => {
    const key = `${error.message.slice(0, 400)} (jobs at ${rate} lines/s)`;
    retries.set(key, (retries.get(key) ?? 0) + 1);
    if (process.env.BENCH_FLEET_DEBUG) console.error("retry", rate, error.message);
  };
  await new Promise<void>((resolve) => {
    let last = performance.now();
    const timer = setInterval(() => {
      const elapsed = performance.now() - t0;
      lag = Math.max(lag, performance.now() - last - TICK_MS);
      last = performance.now();
      for (const a of agents) {
        if (elapsed < a.job.startMs) continue;
        a.client ??= createRunnerClient({
          endpoint,
          requestId: a.job.id,
          token: mintJobToken(msg.secret, a.job.id),
          onRetry: onRetry(a.job.rate),
          maxCallMs: MAX_CALL_MS,
        });
        a.due += (a.job.rate * TICK_MS) / 1000;
        while (a.due >= 1) {
          a.due -= 1;
          a.client.log(line(a.sent++), a.sent % 10 === 0);
        }
      }
      if (elapsed >= msg.durationMs) {
        clearInterval(timer);
        resolve();
      }
    }, TICK_MS);
  });
  await Promise.all(
    agents.map(async (a) => {
      a.client ??= createRunnerClient({ endpoint, requestId: a.job.id, token: mintJobToken(msg.secret, a.job.id) });
      try {
        await a.client.end({ exitCode: 0, success: true, repoUrl: "https://example.com/r.git", commitSha: "abc" });
      } catch {
        failed++;
      } finally {
        await a.client.close();
      }
    }),
  );
  const pings = probe.stop();
  const calls = agents.reduce((n, a) => n + (a.client?.stats.calls ?? 0), 0);
  process.send?.(
    {
      sent: agents.map((a) => ({ id: a.job.id, lines: a.sent })),
      failed,
      calls,
      retries: Object.fromEntries(retries),
      lag,
      cpuMs: (process.cpuUsage().user + process.cpuUsage().system) / 1000,
      runQueueMs: runQueueMs(),
      pings,
    },
    () => process.exit(0),
  );
});
