/**
 * What tiny DATA frames cost the runner server (issue 31): its CPU per byte for 16 KiB frames,
 * for one call in one-byte frames, and for the attacker's best under the frame floor (a new call
 * every 1,000 one-byte frames), with the floor (`dataFrameBytes` 32) and without it (1). The
 * server runs in its own process (its CPU is read there); one-byte frames come from the
 * frame-splitting proxy of the tests. Not part of `npm run bench`: run
 * `npx tsx bench/runner-data-frames.ts`; figures go to RELIABILITY.md.
 */
import { fork } from "node:child_process";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import { createMemoryQueue } from "../src/adapters/memory/index.js";
import { createRunnerService, mintJobToken, startRunnerServer } from "../src/runner/index.js";
import { startFrameSplittingProxy } from "../test/fixtures/h2-frame-splitter-proxy.js";
import { connect, frame, openCall } from "../test/fixtures/runner-raw-calls.js";
import { end, line } from "../test/fixtures/runner-service.js";

const SECRET = "data-frames-bench-secret-0123456789";

if (process.argv[2] === "server") {
  const runner = createRunnerService(createMemoryQueue(), { secret: SECRET, limits: { jobLogBytes: 1 << 30 } });
  const server = await startRunnerServer(runner, {
    port: 0,
    readLimits: { dataFrameBytes: Number(process.env.FLOOR) },
  });
  process.on("message", (msg: string) => {
    if (msg === "cpu") {
      const cpu = process.cpuUsage();
      process.send!({ cpu: cpu.user + cpu.system });
    } else if (msg === "stop") void server.close().then(() => runner.close().then(() => process.exit(0)));
  });
  process.send!({ port: server.port });
} else {
  await main();
}

interface Child {
  port: number;
  cpu(): Promise<number>;
  stop(): void;
}

async function startChild(floor: number): Promise<Child> {
  const child = fork(fileURLToPath(import.meta.url), ["server"], {
    execArgv: ["--import", "tsx"],
    env: { ...process.env, FLOOR: String(floor) },
  });
  const port = await new Promise<number>((resolve) => child.once("message", (m: { port: number }) => resolve(m.port)));
  return {
    port,
    cpu: () =>
      new Promise((resolve) => {
        child.once("message", (m: { cpu: number }) => resolve(m.cpu));
        child.send("cpu");
      }),
    stop: () => child.send("stop"),
  };
}

/** One call on its own connection to `url`: `body` then the end; resolves when it has an answer. */
async function call(url: string, body: Buffer): Promise<void> {
  const session = connect(url);
  try {
    const c = openCall(session, "grpc", mintJobToken(SECRET, body.subarray(7, 43).toString()));
    c.stream.end(body);
    await c.status;
  } finally {
    session.close();
  }
}

function items(id: string, lineBytes: number, count: number): Buffer {
  const one = frame(line(id, "x".repeat(lineBytes)));
  return Buffer.concat([...Array.from({ length: count }, () => one), frame(end(id))]);
}

async function measure(floor: number): Promise<void> {
  const child = await startChild(floor);
  const proxy = await startFrameSplittingProxy(child.port, 1);
  const direct = `http://127.0.0.1:${child.port}`;
  const rows: string[] = [];
  async function run(name: string, url: string, bodies: Buffer[], framesOf: () => number) {
    const frames0 = framesOf();
    const cpu0 = await child.cpu();
    const payload = bodies.reduce((a, b) => a + b.length, 0);
    for (const body of bodies) await call(url, body);
    const cpu = (await child.cpu()) - cpu0;
    const frames = framesOf() - frames0;
    const delivered = frames === 0 ? payload : Math.min(payload, frames);
    const wire = delivered + 9 * (frames === 0 ? Math.ceil(payload / 16384) : frames);
    rows.push(
      `${name}: ${(cpu / 1000).toFixed(0)} ms CPU, ${delivered} payload bytes delivered, ` +
        `${((cpu * 1000) / delivered).toFixed(1)} ns/payload byte, ${((cpu * 1000) / wire).toFixed(1)} ns/wire byte`,
    );
  }
  const bulk = Array.from({ length: 20 }, () => items(randomUUID(), 1000, 1000));
  await run("16 KiB frames, 20 calls × 1 MB", direct, bulk, () => 0);
  await run("one-byte frames, 1 call of 200 KB", proxy.url, [items(randomUUID(), 1000, 190)], () => proxy.dataFrames);
  // Under the floor the attacker's best: ~1,000 frames a call (one 950-byte line and the end), then a new call.
  const small = Array.from({ length: 100 }, () => items(randomUUID(), 900, 1));
  await run("one-byte frames, 100 calls × 1 KB", proxy.url, small, () => proxy.dataFrames);
  // The same calls in whole frames: what a call costs whatever its frames.
  const smallWhole = Array.from({ length: 100 }, () => items(randomUUID(), 900, 1));
  await run("whole frames, 100 calls × 1 KB", direct, smallWhole, () => 0);
  console.log(`dataFrameBytes ${floor}:\n  ${rows.join("\n  ")}`);
  await proxy.close();
  child.stop();
}

async function main(): Promise<void> {
  await measure(1);
  await measure(32);
}
