/**
 * Boots the VM test's Debian image (test/vm/image.sh) under QEMU: the disk read-only
 * (snapshot=on, so one cached image serves every run), a NoCloud seed (vfat, label CIDATA)
 * made from the given user data (the guest's static address is baked into the image), and user-mode networking with
 * restrict=on whose only way out is one guestfwd per host port: the guest reaches
 * GUEST_HOST:<port> and nothing else.
 */
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, existsSync, readFileSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";

/** The address the guest dials for the host's forwarded ports (in QEMU's 10.0.2.0/24). */
export const GUEST_HOST = "10.0.2.100";

/** KVM where it boots a stock kernel; a paravirtual KVM (kvm_pvm) boots only PVM guests, so TCG there. */
export function accelerator(): "kvm" | "tcg" {
  const forced = process.env.RUNNER_DEPOT_VM_ACCEL;
  if (forced === "kvm" || forced === "tcg") return forced;
  if (!existsSync("/dev/kvm") || existsSync("/sys/module/kvm_pvm")) return "tcg";
  return "kvm";
}

/** Builds (or finds in the cache) the image: the folder with disk.raw, vmlinuz, initrd.img. */
export function imageDir(): string {
  const script = path.join(path.dirname(new URL(import.meta.url).pathname), "image.sh");
  return execFileSync("bash", [script], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }).trim();
}

/** A running VM: its console so far, and a way to wait for a console line. */
export interface Vm {
  child: ChildProcess;
  console(): string;
  waitForConsole(pattern: RegExp, timeoutMs: number): Promise<RegExpExecArray>;
  stop(): Promise<void>;
  startedAt: number;
}

/**
 * Writes the NoCloud seed: user-data as given, meta-data, and a network-config only when
 * given (the image's own static address is the network; its cloud-init leaves networking alone).
 */
async function seed(dir: string, userData: string, networkConfig: string | null = null): Promise<string> {
  const files = path.join(dir, "seed");
  await mkdir(files, { recursive: true });
  await writeFile(path.join(files, "user-data"), userData);
  await writeFile(path.join(files, "meta-data"), `instance-id: runner-${path.basename(dir)}\nlocal-hostname: runner\n`);
  const names = ["user-data", "meta-data"];
  if (networkConfig !== null) {
    await writeFile(path.join(files, "network-config"), networkConfig);
    names.push("network-config");
  }
  const image = path.join(dir, "seed.img");
  execFileSync("mkfs.vfat", ["-n", "CIDATA", "-C", image, "2048"], { stdio: "ignore" });
  for (const name of names) execFileSync("mcopy", ["-i", image, path.join(files, name), `::${name}`]);
  return image;
}

/**
 * Boots the image with `userData` as its seed; `forward` maps guest ports on GUEST_HOST to
 * host ports on 127.0.0.1 (each connection runs `socat`, QEMU's guestfwd cmd form).
 */
export async function bootVm(options: {
  image: string;
  dir: string;
  userData: string;
  forward: Record<number, number>;
  /** q35 (the default: PCI devices) or microvm (virtio-mmio devices, no PCI, no firmware tables). */
  machine?: "q35" | "microvm";
  /** Another initrd or disk than the image's (test/vm/boot-options.ts measures variants). */
  initrd?: string;
  disk?: string;
  /** Kernel parameters added to the defaults. */
  append?: string;
  /** A network-config for the seed (default none: the image's baked address; test/vm/boot-options.ts tries others). */
  networkConfig?: string | null;
}): Promise<Vm> {
  const seedImage = await seed(options.dir, options.userData, options.networkConfig);
  const guestfwd = Object.entries(options.forward)
    .map(([guest, host]) => `guestfwd=tcp:${GUEST_HOST}:${guest}-cmd:socat - TCP:127.0.0.1:${host}`)
    .join(",");
  const accel = accelerator();
  const microvm = options.machine === "microvm";
  // microvm: no PCI, so the virtio devices are virtio-mmio ones (QEMU appends their
  // virtio_mmio.device= parameters to the kernel's command line itself).
  const bus = microvm ? "device" : "pci";
  const disk = options.disk ?? path.join(options.image, "disk.raw");
  const args = [
    "-machine",
    microvm ? `microvm,accel=${accel},pit=on,pic=on,rtc=on` : `q35,accel=${accel}`,
    ...(accel === "kvm" ? ["-cpu", "host"] : []),
    "-m",
    "1024",
    "-smp",
    "1",
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    "-monitor",
    "none",
    "-serial",
    "stdio",
    "-no-reboot",
    "-kernel",
    path.join(options.image, "vmlinuz"),
    "-initrd",
    options.initrd ?? path.join(options.image, "initrd.img"),
    "-append",
    // no_timer_check: under TCG on a loaded host the kernel's check of the IO-APIC timer can
    // miss its window and panic ("IO-APIC + timer doesn't work!"), seen here on 2026-11-29.
    `root=/dev/vda rw console=ttyS0 panic=-1 no_timer_check${options.append ? ` ${options.append}` : ""}`,
    "-drive",
    `id=root,file=${disk},format=raw,if=none,snapshot=on`,
    "-device",
    `virtio-blk-${bus},drive=root`,
    "-drive",
    `id=seed,file=${seedImage},format=raw,if=none,readonly=on`,
    "-device",
    `virtio-blk-${bus},drive=seed`,
    "-netdev",
    `user,id=n0,restrict=on,${guestfwd}`,
    "-device",
    `virtio-net-${bus},netdev=n0`,
  ];
  const startedAt = performance.now();
  const child = spawn("qemu-system-x86_64", args, { stdio: ["ignore", "pipe", "pipe"] });
  let text = "";
  const waiters = new Set<() => void>();
  // Kept beside the seed, for a failed run's post-mortem.
  const log = createWriteStream(path.join(options.dir, "console.log"));
  const onData = (chunk: Buffer) => {
    text += chunk.toString("utf8");
    log.write(chunk);
    for (const wake of waiters) wake();
  };
  child.stdout!.on("data", onData);
  child.stderr!.on("data", onData);
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  return {
    child,
    startedAt,
    console: () => text,
    waitForConsole(pattern, timeoutMs) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const match = pattern.exec(text);
          if (match) {
            done();
            resolve(match);
          }
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`no ${pattern} on the VM's console in ${timeoutMs} ms; its tail:\n${text.slice(-3000)}`));
        }, timeoutMs);
        const done = () => {
          clearTimeout(timer);
          waiters.delete(check);
        };
        waiters.add(check);
        void exited.then(check);
        check();
      });
    },
    async stop() {
      if (child.exitCode === null) child.kill("SIGKILL");
      await exited;
      log.end();
    },
  };
}

/** The agents `npm run build:agent` wrote. */
export function builtAgents(root: string): {
  dir: string;
  version: string;
  agents: { platform: string; file: string; size: number; sha256: string }[];
} {
  const dir = path.join(root, "build", "agent");
  const manifest = JSON.parse(readFileSync(path.join(dir, "agents.json"), "utf8")) as {
    version: string;
    agents: { platform: string; file: string; size: number; sha256: string }[];
  };
  return { dir, ...manifest };
}
