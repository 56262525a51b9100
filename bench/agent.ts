/**
 * The single-file agent (`npm run build:agent`): its size raw and compressed beside the
 * anchors', and its cold start — process start to the first line stored (and so
 * acknowledged) by the runner — against `runner-depot agent` under Node, in the same run.
 * The VM figure (boot to first line on the host) comes from the last `npm run test:vm`
 * (build/agent/vm-figures.json), which writes it.
 */
import { execFileSync, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import { createMemoryLogStore, createMemoryQueue } from "../src/adapters/memory/index.js";
import { createRunnerService, startRunnerServer } from "../src/runner/index.js";
import { mintJobToken } from "../src/runner/protocol/token.js";
import { bundleCli } from "../test/fixtures/cli-bundle.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const ROUNDS = 7;

const mb = (bytes: number) => `${(bytes / 1e6).toFixed(1)} MB`;
const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;

/** Spawns `argv` as an agent for a fresh job; answers ms from spawn to its first stored line. */
async function coldStart(
  argv: string[],
  runner: ReturnType<typeof createRunnerService>,
  url: string,
  secret: string,
): Promise<number> {
  const requestId = randomUUID();
  await runner.expectJob(requestId);
  const lines = runner.follow(requestId)[Symbol.asyncIterator]();
  const started = performance.now();
  const child = spawn(
    argv[0]!,
    [
      ...argv.slice(1),
      "--endpoint",
      url,
      "--request-id",
      requestId,
      "--token",
      mintJobToken(secret, requestId),
      "--quiet",
      "--",
      "echo",
      "first",
    ],
    { stdio: "ignore" },
  );
  // Listened for now: a quick agent may be gone before its first line is read here.
  const exited = new Promise((resolve) => child.once("exit", resolve));
  const first = await lines.next();
  const ms = performance.now() - started;
  if (first.done) throw new Error("the agent sent no line");
  await exited;
  await lines.return?.(undefined);
  return ms;
}

export async function run(): Promise<string> {
  const dir = path.join(root, "build", "agent");
  if (!existsSync(path.join(dir, "agents.json"))) execFileSync("npm", ["run", "build:agent"], { stdio: "inherit" });
  const manifest = JSON.parse(readFileSync(path.join(dir, "agents.json"), "utf8")) as {
    node: string;
    bundleSize: number;
    agents: { platform: string; file: string; size: number }[];
  };
  const sizes = manifest.agents.map((agent) => {
    const file = path.join(dir, agent.file);
    const gz = gzipSync(readFileSync(file), { level: 9 }).length;
    // xz at its default level takes minutes for 125 MB on a shared machine: once, for the platform of the host.
    const xz =
      agent.platform === `linux-${os.arch()}`
        ? Number(execFileSync("sh", ["-c", `xz -6 -T2 -c "${file}" | wc -c`], { encoding: "utf8" }).trim())
        : undefined;
    return `| runner-depot-agent-${agent.platform} (Node ${manifest.node} SEA, measured) | ${mb(agent.size)} | ${mb(gz)} | ${xz === undefined ? "" : mb(xz)} |`;
  });

  const secret = "bench-secret";
  const runner = createRunnerService(createMemoryQueue(), { logs: createMemoryLogStore(), secret });
  const server = await startRunnerServer(runner, { port: 0 });
  const cli = await bundleCli();
  const sea = path.join(dir, manifest.agents.find((a) => a.platform === `linux-${os.arch()}`)!.file);
  const ours: number[] = [];
  const peer: number[] = [];
  try {
    // Alternating, so load on the shared machine hits both alike.
    for (let i = 0; i < ROUNDS; i++) {
      ours.push(await coldStart([sea], runner, server.url, secret));
      peer.push(await coldStart([process.execPath, cli.file, "agent"], runner, server.url, secret));
    }
  } finally {
    await cli.remove();
    await server.close();
    await runner.close();
  }
  const bootFile = path.join(dir, "vm-boot-options.json");
  const boot = existsSync(bootFile) ? bootOptionsTable(JSON.parse(readFileSync(bootFile, "utf8")) as BootOptions) : [];
  const vmFile = path.join(dir, "vm-figures.json");
  const vm = existsSync(vmFile)
    ? (JSON.parse(readFileSync(vmFile, "utf8")) as { bootToFirstLineMs: number; accel: string; at: string })
    : undefined;
  return [
    "## Single-file agent",
    "",
    `${new Date().toISOString().slice(0, 10)}, ${os.cpus().length} cores (${os.cpus()[0]?.model ?? "?"}), shared with other work: times are noisy.`,
    "",
    "| agent | raw | gzip -9 | xz -6 |",
    "|---|---:|---:|---:|",
    ...sizes,
    `| its script alone (esbuild, minified) | ${(manifest.bundleSize / 1e3).toFixed(0)} KB | | |`,
    "| Gitea act_runner (package, as published) | | 6.4 MB | |",
    "| GitHub Actions runner (tarball, as published) | | 73 MB and more | |",
    "",
    "The anchors' figures are their published downloads, not measured here.",
    "",
    `Cold start, process start → first line stored by the runner (a line is acknowledged after it is stored), median of ${ROUNDS} alternating runs, same server:`,
    "",
    "| agent | median | ratio |",
    "|---|---:|---:|",
    `| single-file agent (SEA) | ${median(ours).toFixed(0)} ms | ${(median(ours) / median(peer)).toFixed(2)} |`,
    `| peer: \`node dist/cli.js agent\` (the npm package under Node ${process.versions.node}) | ${median(peer).toFixed(0)} ms | 1 |`,
    "",
    vm
      ? `VM boot to the first line on the host (QEMU ${vm.accel}, Debian bookworm, no Node, agent fetched with python3 from the depot, \`npm run test:vm\` on ${vm.at}): ${(vm.bootToFirstLineMs / 1000).toFixed(0)} s.`
      : "VM boot to the first line: run `npm run test:vm` first (it writes build/agent/vm-figures.json).",
    "",
    ...boot,
  ].join("\n");
}

/** What test/vm/boot-options.ts writes: each boot option's runs. */
interface BootOptions {
  at: string;
  accel: string;
  load: { min: number; max: number };
  /** Boots at once; the variants of a round run in that order, so a round's first `parallel` share a batch. */
  parallel?: number;
  /** Runs added after the rounds (a batch of the variants named, at once), as a note says. */
  note?: string;
  variants: {
    name: string;
    what: string;
    runs: { ms?: number; cpu?: number; load: number; marks: Record<string, number> }[];
  }[];
}

/**
 * The boot options' table: median CPU seconds QEMU used to the first line (TCG: the boot's own cost, which the
 * machine's load hardly moves) and wall seconds, each against the image as the VM test boots it (`baseline`).
 */
function bootOptionsTable(b: BootOptions): string[] {
  const med = (xs: number[]) => (xs.length === 0 ? NaN : median(xs));
  const figures = b.variants.map((v) => {
    const ok = v.runs.filter((r) => r.ms !== undefined);
    return {
      v,
      ok: ok.length,
      cpu: med(ok.filter((r) => r.cpu !== undefined).map((r) => r.cpu!)),
      wall: med(ok.map((r) => r.ms! / 1000)),
      init: med(ok.filter((r) => r.marks.init !== undefined).map((r) => r.marks.init! / 1000)),
    };
  });
  const base = figures.find((f) => f.v.name === "baseline");
  const ratio = (x: number, y: number | undefined) =>
    y === undefined || !Number.isFinite(x) ? "" : `${(x / y).toFixed(2)}×`;
  const s = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : "—");
  return [
    `Boot options (\`test/vm/boot-options.ts\`, QEMU ${b.accel}, ${b.at.slice(0, 16).replace("T", " ")} UTC, load average ${b.load.min.toFixed(1)}–${b.load.max.toFixed(1)} on ${os.cpus().length} cores): ` +
      "boot to a first line on the host from the seed's runcmd (python3 through the same guestfwd; the agent's fetch, the same for every option, left out), rounds interleaved, medians. " +
      "CPU s: QEMU's user + system time until the line arrived (under TCG the guest runs on one host thread, so this is the boot's own cost; the wall time also counts waiting for a core)." +
      (b.parallel !== undefined && b.parallel > 1
        ? ` ${b.parallel} boots at once, in the order of the rows: a round's boots in the same batch compare best (CPU time still grows a little with the boots beside it).`
        : "") +
      (b.note ? ` ${b.note}` : ""),
    "",
    "| option | runs with a line | QEMU CPU s (median) | ÷ baseline | wall s (median) | kernel → initrd's /init (wall s) |",
    "|---|---:|---:|---:|---:|---:|",
    ...figures.map(
      (f) =>
        `| **${f.v.name}**: ${f.v.what} | ${f.ok} of ${f.v.runs.length} | ${s(f.cpu)} | ${ratio(f.cpu, base?.cpu)} | ${s(f.wall)} | ${s(f.init)} |`,
    ),
    "",
  ];
}
