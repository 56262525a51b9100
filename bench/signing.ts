/**
 * What signed versions cost (issue 26): a 256 MiB publish with `sign` against the same
 * publish without, and an install under `require` against one under `ignore`, through a
 * real depot (servePackageRouter over the fs store, in this process) and the client. Two
 * shapes: one 256 MiB file, and 4,096 files of 64 KiB (the statement names every file, so
 * its cost follows the file count). Signed and unsigned turns alternate within each round,
 * each publish on bytes new to the store, so the shared machine's load falls alike on both.
 */
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createFsStore } from "../src/adapters/fs/store.js";
import { createDepotClient } from "../src/depot/client/depot-client.js";
import { createPackageRouter } from "../src/depot/server/router.js";
import { servePackageRouter } from "../src/depot/server/serve.js";
import { generateSigningKey, signingKeyFromPem, trustedKeyEntry } from "../src/depot/signing/keys.js";

const MiB = 2 ** 20;
/** 256 MiB; BENCH_FILE_MIB overrides it for a quick trial (the report states the size used). */
const TOTAL = (Number(process.env.BENCH_FILE_MIB) || 256) * MiB;
const ROUNDS = 5;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
/** Wall time and this process's CPU time, ms. */
interface Cost {
  ms: number;
  cpu: number;
}
/** "CPU (wall)", medians. */
const fmtCost = (costs: Cost[]) =>
  `${Math.round(median(costs.map((c) => c.cpu)))} ms CPU (${Math.round(median(costs.map((c) => c.ms)))} ms wall)`;

/** Wall time and this process's CPU time (user + system: the client and the server both run here), ms. */
async function timed(fn: () => Promise<unknown>): Promise<Cost> {
  const cpu0 = process.cpuUsage();
  const start = performance.now();
  await fn();
  const cpu = process.cpuUsage(cpu0);
  return { ms: performance.now() - start, cpu: (cpu.user + cpu.system) / 1000 };
}

/** Writes `files` files totalling TOTAL bytes under `dir`, each starting with `tag` so its bytes are new. */
async function fill(dir: string, files: number, tag: Buffer, body: Buffer): Promise<void> {
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  const size = TOTAL / files;
  for (let i = 0; i < files; i++) {
    const bytes = Buffer.from(body.subarray(i * size, (i + 1) * size));
    tag.copy(bytes, 0);
    bytes.writeUInt32BE(i, tag.length);
    await writeFile(path.join(dir, `f${String(i).padStart(5, "0")}`), bytes);
  }
}

export async function run(): Promise<string> {
  const work = await mkdtemp(path.join(os.tmpdir(), "bench-signing-"));
  const key = generateSigningKey();
  const trustedKeys = { keys: [trustedKeyEntry(key)] };
  const store = createFsStore(path.join(work, "store"), { unsafeNoSync: true });
  const server = await servePackageRouter(createPackageRouter(store, { trustedKeys }), { host: "127.0.0.1", port: 0 });
  const client = createDepotClient({ baseUrl: server.url });
  const body = randomBytes(TOTAL);
  const rows: string[] = [];
  const loadBefore = os.loadavg()[0]!;
  try {
    for (const files of [1, 4096]) {
      const cost = { publish: [] as Cost[], sign: [] as Cost[], install: [] as Cost[], verify: [] as Cost[] };
      const ratios = { publish: [] as number[], install: [] as number[] };
      for (let round = 0; round < ROUNDS; round++) {
        const src = path.join(work, "src");
        await fill(src, files, randomBytes(8), body);
        const spec = `big@${files}.${round}.0`;
        const version = `${files}.${round}.0`;
        // What a signed publish adds to an unsigned one is exactly client.sign after it; what an
        // install under require adds to one under ignore is the attestations' read and check.
        const publish = await timed(() => client.publish({ name: "big", version, dir: src, byReference: false }));
        const sign = await timed(() => client.sign(spec, signingKeyFromPem(key.privateKey)));
        const target = path.join(work, "install");
        await rm(target, { recursive: true, force: true });
        const install = await timed(() => client.install(spec, target, { signatures: { policy: "ignore" } }));
        const verify = await timed(() => client.verify(spec, { policy: "require", trustedKeys }));
        cost.publish.push(publish);
        cost.sign.push(sign);
        cost.install.push(install);
        cost.verify.push(verify);
        ratios.publish.push((publish.cpu + sign.cpu) / publish.cpu);
        ratios.install.push((install.cpu + verify.cpu) / install.cpu);
      }
      const shape =
        files === 1
          ? `one ${TOTAL / MiB} MiB file`
          : `${files.toLocaleString("en")} files of ${TOTAL / files / 1024} KiB`;
      const pct = (r: number) => `+${((r - 1) * 100).toFixed(1)} %`;
      rows.push(
        `| publish, ${shape}: signing it (\`client.sign\`) | ${fmtCost(cost.sign)} | the unsigned publish | ${fmtCost(cost.publish)} | ${median(ratios.publish).toFixed(3)} (${pct(median(ratios.publish))}) | ≤ 1.05 |`,
        `| install, ${shape}: verifying it (attestations read and checked, \`require\`) | ${fmtCost(cost.verify)} | the install under \`ignore\` | ${fmtCost(cost.install)} | ${median(ratios.install).toFixed(3)} (${pct(median(ratios.install))}) | ≤ 1.05 |`,
      );
    }
  } finally {
    await server.close();
    await store.close?.();
    await rm(work, { recursive: true, force: true });
  }
  return [
    "## Depot: signing and verifying a 256 MiB version",
    "",
    `Method: \`servePackageRouter\` over \`createFsStore\` (fsync off) in this process; the client publishes from a folder with \`byReference: false\` (every byte sent), then signs the version (\`client.sign\`: reads \`/version\` and the manifest back, builds the in-toto statement, signs it with Ed25519, \`POST /attestations\`, where the depot checks it against the manifest), which is all a signed publish adds; then installs it into an empty folder under \`ignore\`, then verifies it (\`client.verify\` under \`require\`: \`/version\`, the manifest, \`GET /attestations\`, the signature and every file's digest), which is more than an install under \`require\` adds (it reads neither \`/version\` nor the manifest again). ${ROUNDS} rounds, each on bytes new to the store; figures are medians, the ratio the median over rounds of (operation + its signing or verifying) ÷ operation in CPU time (this process's user + system, \`process.cpuUsage\`; client and server both run in it). The machine (2 cores) is shared with other work (1-minute load average ${loadBefore.toFixed(1)} before, ${os.loadavg()[0]!.toFixed(1)} after): wall times, in brackets, are noisy.`,
    "",
    "| operation | signed / verified | peer | peer | ratio | aim |",
    "|---|---:|---|---:|---:|---|",
    ...rows,
  ].join("\n");
}
