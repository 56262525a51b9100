/**
 * Measures what each cheap boot option of the VM test buys (issue 25, "make boot fast where
 * that is cheap"): boot to the first line on the host, rounds interleaved so the shared
 * machine's load hits every variant alike. The guest's runcmd sends one line through the
 * same guestfwd path the agent uses; the agent's own fetch (about 24 s under TCG, the same
 * for every variant) is left out. Variants are made from the cached image without
 * rebuilding it: other initrds from its root (debugfs rdump + chroot update-initramfs), and
 * other network set-ups by editing a copy of its disk with debugfs. Writes
 * build/agent/vm-boot-options.json, which bench/agent.ts prints.
 *
 * Usage (root, after test/vm/image.sh): `npx tsx test/vm/boot-options.ts [rounds] [variant…]`
 */
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { GUEST_HOST, accelerator, bootVm, imageDir } from "./qemu.js";

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..", "..");
const PORT = 7000;
const TIMEOUT_MS = Number(process.env.RUNNER_DEPOT_VM_BOOT_TIMEOUT_MS ?? 300_000);

interface Variant {
  name: string;
  what: string;
  machine?: "q35" | "microvm";
  initrd?: string;
  disk?: string;
  append?: string;
  networkConfig?: string | null;
}

/** Runs a command, its output to stderr. */
function sh(cmd: string, args: string[], cwd?: string): void {
  execFileSync(cmd, args, { stdio: ["ignore", process.stderr, "inherit"], cwd });
}

/** The image's root, extracted once (debugfs, no loop device), for building other initrds. */
function extractedRoot(image: string, work: string): string {
  const dir = path.join(work, "root");
  if (existsSync(path.join(dir, "etc"))) return dir;
  mkdirSync(dir, { recursive: true });
  sh("debugfs", ["-R", `rdump / ${dir}`, path.join(image, "disk.raw")]);
  return dir;
}

/** An initrd built in the image's root with `modules` as initramfs.conf's MODULES and `list` as its module list. */
function initrd(rootDir: string, name: string, modules: string, list: string[]): string {
  const out = path.join(path.dirname(rootDir), `initrd-${name}.img`);
  if (existsSync(out)) return out;
  const conf = path.join(rootDir, "etc/initramfs-tools/initramfs.conf");
  writeFileSync(conf, readFileSync(conf, "utf8").replace(/^MODULES=.*$/m, `MODULES=${modules}`));
  writeFileSync(path.join(rootDir, "etc/initramfs-tools/modules"), list.map((m) => `${m}\n`).join(""));
  const version = execFileSync("ls", [path.join(rootDir, "lib/modules")], { encoding: "utf8" })
    .trim()
    .split("\n")[0]!;
  sh("chroot", [rootDir, "mkinitramfs", "-o", `/tmp/initrd-${name}.img`, version]);
  execFileSync("cp", [path.join(rootDir, "tmp", `initrd-${name}.img`), out]);
  return out;
}

/** A copy of the image's disk with debugfs `requests` applied (one per line). */
function disk(image: string, work: string, name: string, requests: string): string {
  const out = path.join(work, `disk-${name}.raw`);
  if (existsSync(out)) return out;
  execFileSync("cp", ["--sparse=always", path.join(image, "disk.raw"), out]);
  const file = path.join(work, `debugfs-${name}.txt`);
  writeFileSync(file, requests);
  sh("debugfs", ["-w", "-f", file, out]);
  return out;
}

/** A networkd unit written into the disk by debugfs (from a host file). */
function unitFile(work: string, name: string, body: string): string {
  const file = path.join(work, `${name}.network`);
  writeFileSync(file, body);
  return file;
}

/**
 * The static address as cloud-init 22.4 applies it: keyed by the interface's own name. Keyed
 * `nic` with `match: {name: 'e*'}` (what the VM test's seed carried until 2026-11-29), its
 * networkd renderer wrote `Name=nic`, which matches no link.
 */
const SEED_NETWORK = "version: 2\nethernets:\n  eth0:\n    addresses: [10.0.2.15/24]\n";

function variants(image: string, work: string): Variant[] {
  const rootDir = () => extractedRoot(image, work);
  const unit = "/etc/systemd/network/20-runner-vm.network";
  return [
    {
      name: "baseline",
      what: "the VM test's image: q35, an initrd of the virtio and ext4 modules only, the static address baked in",
    },
    {
      name: "initrd-most",
      what: "as baseline, Debian's default initrd (MODULES=most)",
      get initrd() {
        return initrd(rootDir(), "most", "most", []);
      },
    },
    {
      name: "dhcp",
      what: "as baseline, the baked unit asks QEMU's DHCP instead (what a stock image does)",
      networkConfig: null,
      get disk() {
        const body = unitFile(
          work,
          "dhcp",
          "[Match]\nName=e*\n\n[Network]\nDHCP=ipv4\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n",
        );
        return disk(image, work, "dhcp", `rm ${unit}\nwrite ${body} ${unit}\n`);
      },
    },
    {
      name: "seed-network",
      what: "nothing baked: the seed's network-config v2 (static, keyed eth0) rendered by cloud-init",
      networkConfig: SEED_NETWORK,
      append: "net.ifnames=0",
      get disk() {
        // cloud-init's networking back on (the image disables it): the image's config without that line.
        const cfg = path.join(work, "90-runner-depot.cfg");
        writeFileSync(cfg, "datasource_list: [ NoCloud, None ]\nlocale: false\n");
        const at = "/etc/cloud/cloud.cfg.d/90-runner-depot.cfg";
        return disk(image, work, "seednet", `rm ${unit}\nrm ${at}\nwrite ${cfg} ${at}\n`);
      },
    },
    {
      name: "kernel-ip",
      what: "nothing baked: the kernel's ip= parameter (systemd-network-generator turns it into a networkd unit)",
      networkConfig: null,
      append: "ip=10.0.2.15::10.0.2.2:255.255.255.0::eth0:off net.ifnames=0",
      get disk() {
        return disk(image, work, "nobake", `rm ${unit}\n`);
      },
    },
    {
      name: "microvm",
      what: "microvm machine (virtio-mmio), initrd of virtio_mmio+virtio+ext4",
      machine: "microvm",
      get initrd() {
        return initrd(rootDir(), "mmio", "list", ["virtio_mmio", "virtio_blk", "ext4"]);
      },
    },
    {
      name: "microvm-lpj",
      what: "as microvm, the delay loop and the timer check skipped (TCG fails the PIT calibration; microvm has no HPET)",
      machine: "microvm",
      append: "lpj=10000000 tsc=unstable",
      get initrd() {
        return initrd(rootDir(), "mmio", "list", ["virtio_mmio", "virtio_blk", "ext4"]);
      },
    },
    {
      name: "microvm-noapic",
      what: "as microvm-lpj, the timer through the i8259 PIC (noapic), no local APIC timer",
      machine: "microvm",
      append: "lpj=10000000 tsc=unstable noapic nolapic_timer",
      get initrd() {
        return initrd(rootDir(), "mmio", "list", ["virtio_mmio", "virtio_blk", "ext4"]);
      },
    },
  ];
}

// The probe: one line to the host (5 s to connect), then what the network looked like, and
// a marker, on the console (so a variant whose network never came up ends at the marker).
// BOOT_DIAGNOSE=1: first where the boot went (systemd-analyze, cloud-init's own stage times), on the console.
const DIAGNOSE = process.env.BOOT_DIAGNOSE === "1";
const PROBE = [
  "#cloud-config",
  "runcmd:",
  ...(DIAGNOSE
    ? [
        "  - [sh, -c, 'exec >/dev/console 2>&1; echo diag-start; systemd-analyze; systemd-analyze blame | head -n 25; systemd-analyze critical-chain cloud-final.service; cloud-init analyze show | grep -i \"finished\\|total\\|stage\" | head -n 40; echo diag-end']",
      ]
    : []),
  `  - [python3, -c, "import socket\\ntry:\\n  s = socket.create_connection(('${GUEST_HOST}', ${PORT}), timeout=5); s.sendall(b'first line\\\\n'); s.close()\\nexcept OSError as e:\\n  print('probe:', e)"]`,
  "  - [sh, -c, 'exec >/dev/console 2>&1; ip -br addr; ls /etc/systemd/network /run/systemd/network; grep -i \"network\\\\|render\" /var/log/cloud-init.log | tail -n 8; echo probe-done']",
  "",
].join("\n");

/** CPU seconds (user + system) a process has used so far, from /proc (clock ticks of 10 ms). */
function cpuSeconds(pid: number | undefined): number | undefined {
  if (pid === undefined) return undefined;
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
    // utime and stime are fields 14 and 15 of the line; 12 and 13 after "pid (comm) ".
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return undefined;
  }
}

/**
 * One boot: ms from QEMU's start to the first line on the host, the CPU seconds QEMU used
 * until then (TCG runs the guest on one host thread: CPU time is what the boot costs,
 * whatever else the machine is doing), and console milestones.
 */
async function boot(image: string, work: string, v: Variant, round: number) {
  const server = net.createServer();
  let gotLine: (at: number) => void = () => {};
  const firstLine = new Promise<number>((resolve) => (gotLine = resolve));
  let cpu: number | undefined;
  let pid: number | undefined;
  server.on("connection", (socket) =>
    socket.once("data", () => {
      cpu = cpuSeconds(pid);
      gotLine(performance.now());
    }),
  );
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  const dir = path.join(work, `run-${v.name}-${round}-${process.pid}`);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const vm = await bootVm({
    image,
    dir,
    userData: PROBE,
    forward: { [PORT]: port },
    machine: v.machine,
    initrd: v.initrd,
    disk: v.disk,
    append: v.append,
    networkConfig: v.networkConfig,
  });
  pid = vm.child.pid;
  const marks: Record<string, number> = {};
  const watch = async (name: string, pattern: RegExp) => {
    try {
      await vm.waitForConsole(pattern, TIMEOUT_MS);
      marks[name] = Math.round(performance.now() - vm.startedAt);
    } catch {
      /* not seen */
    }
  };
  void watch("init", /Run \/init as init process/);
  void watch("systemd", /Welcome to |systemd\[1\]: systemd \d+ running/);
  let ms: number | undefined;
  try {
    const at = await Promise.race([
      firstLine,
      vm.waitForConsole(/probe-done/, TIMEOUT_MS).then(
        () => undefined,
        () => undefined,
      ),
    ]);
    if (at !== undefined) ms = Math.round(at - vm.startedAt);
  } finally {
    await vm.stop();
    server.close();
  }
  const text = vm.console();
  const diag = DIAGNOSE ? text.slice(text.indexOf("diag-start"), text.indexOf("diag-end")) : "";
  return { ms, cpu, marks, console: ms === undefined ? text.slice(-4000) : DIAGNOSE ? diag : undefined };
}

const args = process.argv.slice(2);
const rounds = Number(args[0] ?? 3);
const only = new Set(args.slice(1));
const image = imageDir();
// Variants are made from this image, so kept per image (its folder's name is its recipe's hash).
const work = path.join(image, "..", "vm-boot-options", path.basename(image));
mkdirSync(work, { recursive: true });
const chosen = variants(image, work).filter((v) => only.size === 0 || only.has(v.name));
// Variants built before any boot (their debugfs and chroot work is not timed).
for (const v of chosen) void [v.initrd, v.disk];
const results: Record<string, { ms?: number; cpu?: number; load: number; marks: Record<string, number> }[]> = {};
const load: number[] = [];
// BOOT_PARALLEL boots at once (default 1): CPU seconds are comparable either way, wall times less so.
const parallel = Number(process.env.BOOT_PARALLEL ?? 1);
for (let round = 0; round < rounds; round++) {
  const queue = [...chosen];
  const worker = async () => {
    for (let v = queue.shift(); v !== undefined; v = queue.shift()) {
      const at = os.loadavg()[0]!;
      load.push(at);
      const r = await boot(image, work, v, round);
      (results[v.name] ??= []).push({ ms: r.ms, cpu: r.cpu, load: at, marks: r.marks });
      process.stderr.write(
        `${v.name} round ${round}: ${r.ms ?? "no line"} ms, ${r.cpu ?? "?"} s CPU ${JSON.stringify(r.marks)} load ${at}\n`,
      );
      if (r.console) process.stderr.write(`--- console tail ---\n${r.console}\n---\n`);
    }
  };
  await Promise.all(Array.from({ length: parallel }, worker));
}
const out = path.join(root, "build", "agent", "vm-boot-options.json");
mkdirSync(path.dirname(out), { recursive: true });
writeFileSync(
  out,
  `${JSON.stringify(
    {
      at: new Date().toISOString(),
      accel: accelerator(),
      load: { min: Math.min(...load), max: Math.max(...load) },
      parallel,
      variants: chosen.map((v) => ({ name: v.name, what: v.what, runs: results[v.name] })),
    },
    null,
    2,
  )}\n`,
);
process.stdout.write(`${out}\n`);
// The console waits of the boots that got their line still hold timers: done.
process.exit(0);
