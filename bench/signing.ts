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
/** "CPU s (wall s)", medians. */
const fmtCost = (cpu: number[], wall: number[]) =>
  `${(median(cpu) / 1000).toFixed(2)} s CPU (${(median(wall) / 1000).toFixed(2)} s wall)`;

/** Wall time and this process's CPU time (user + system: the client and the server both run here), ms. */
async function timed(fn: () => Promise<unknown>): Promise<{ ms: number; cpu: number }> {
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
      const times = { plain: [] as number[], signed: [] as number[], ignore: [] as number[], require: [] as number[] };
      const cpus = { plain: [] as number[], signed: [] as number[], ignore: [] as number[], require: [] as number[] };
      const ratios = { publish: [] as number[], install: [] as number[] };
      for (let round = 0; round < ROUNDS; round++) {
        const cost: Record<string, { ms: number; cpu: number }> = {};
        // Alternate which goes first, round by round.
        const order = round % 2 === 0 ? (["plain", "signed"] as const) : (["signed", "plain"] as const);
        for (const kind of order) {
          const src = path.join(work, `src-${kind}`);
          await fill(src, files, randomBytes(8), body);
          const version = `${files}.${round}.0-${kind}`;
          cost[kind] = await timed(() =>
            client.publish({
              name: "big",
              version,
              dir: src,
              byReference: false,
              ...(kind === "signed" ? { sign: signingKeyFromPem(key.privateKey) } : {}),
            }),
          );
          times[kind].push(cost[kind]!.ms);
          cpus[kind].push(cost[kind]!.cpu);
        }
        const spec = `big@${files}.${round}.0-signed`;
        for (const policy of round % 2 === 0 ? (["ignore", "require"] as const) : (["require", "ignore"] as const)) {
          const target = path.join(work, `install-${policy}`);
          await rm(target, { recursive: true, force: true });
          cost[policy] = await timed(() => client.install(spec, target, { signatures: { policy, trustedKeys } }));
          times[policy].push(cost[policy]!.ms);
          cpus[policy].push(cost[policy]!.cpu);
        }
        // CPU, not wall time: on a shared, loaded machine the wall time of one turn swings by
        // more than the whole signing cost; this process's CPU counts only its own work.
        ratios.publish.push(cost.signed!.cpu / cost.plain!.cpu);
        ratios.install.push(cost.require!.cpu / cost.ignore!.cpu);
      }
      const shape =
        files === 1
          ? `one ${TOTAL / MiB} MiB file`
          : `${files.toLocaleString("en")} files of ${TOTAL / files / 1024} KiB`;
      const pct = (r: number) => `${((r - 1) * 100).toFixed(1)} %`;
      rows.push(
        `| publish, ${shape}: \`sign\` | ${fmtCost(cpus.signed, times.signed)} | unsigned publish | ${fmtCost(cpus.plain, times.plain)} | ${median(ratios.publish).toFixed(3)} (${pct(median(ratios.publish))}) | ≤ 1.05 |`,
        `| install, ${shape}: policy \`require\` | ${fmtCost(cpus.require, times.require)} | policy \`ignore\` | ${fmtCost(cpus.ignore, times.ignore)} | ${median(ratios.install).toFixed(3)} (${pct(median(ratios.install))}) | ≤ 1.05 |`,
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
    `Method: \`servePackageRouter\` over \`createFsStore\` (fsync off, so the disk's flushes do not drown the difference) in this process, the client publishing from a folder with \`byReference: false\` (every byte sent) and installing into an empty folder. A signed publish adds reading the version and its manifest back, an Ed25519 signature over the in-toto statement and \`POST /attestations\` (the depot verifies it against the manifest); an install under \`require\` adds \`GET /attestations\` and the check of every file's digest against the statement. In each of ${ROUNDS} rounds the signed and unsigned turns alternate in order, each publish on bytes new to the store; figures are medians. The ratio is of CPU time (this process's user + system, \`process.cpuUsage\`; client and server both run in it), the median over rounds of signed ÷ unsigned in the same round: the machine (2 cores) is shared with other work (1-minute load average ${loadBefore.toFixed(1)} before, ${os.loadavg()[0]!.toFixed(1)} after), and one turn's wall time swings by more than the whole cost of signing, so wall times (in brackets) are noise here.`,
    "",
    "| operation | signed / verified | peer | peer | ratio | aim |",
    "|---|---:|---|---:|---:|---|",
    ...rows,
  ].join("\n");
}
