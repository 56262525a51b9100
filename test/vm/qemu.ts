/**
 * Boots the VM test's Debian image (test/vm/image.sh) under QEMU: the disk read-only
 * (snapshot=on, so one cached image serves every run), a NoCloud seed (vfat, label CIDATA)
 * made from the given user data with a static network, and user-mode networking with
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

/** Writes the NoCloud seed: user-data as given, meta-data, and a static network (no DHCP wait). */
async function seed(dir: string, userData: string): Promise<string> {
  const files = path.join(dir, "seed");
  await mkdir(files, { recursive: true });
  await writeFile(path.join(files, "user-data"), userData);
  await writeFile(path.join(files, "meta-data"), `instance-id: runner-${path.basename(dir)}\nlocal-hostname: runner\n`);
  await writeFile(
    path.join(files, "network-config"),
    "version: 2\nethernets:\n  nic:\n    match: { name: 'e*' }\n    addresses: [10.0.2.15/24]\n",
  );
  const image = path.join(dir, "seed.img");
  execFileSync("mkfs.vfat", ["-n", "CIDATA", "-C", image, "2048"], { stdio: "ignore" });
  for (const name of ["user-data", "meta-data", "network-config"])
    execFileSync("mcopy", ["-i", image, path.join(files, name), `::${name}`]);
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
}): Promise<Vm> {
  const seedImage = await seed(options.dir, options.userData);
  const guestfwd = Object.entries(options.forward)
    .map(([guest, host]) => `guestfwd=tcp:${GUEST_HOST}:${guest}-cmd:socat - TCP:127.0.0.1:${host}`)
    .join(",");
  const accel = accelerator();
  const args = [
    "-machine",
    `q35,accel=${accel}`,
    ...(accel === "kvm" ? ["-cpu", "host"] : []),
    "-m",
    "1024",
    "-smp",
    "1",
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
    path.join(options.image, "initrd.img"),
    "-append",
    "root=/dev/vda rw console=ttyS0 panic=-1",
    "-drive",
    `file=${path.join(options.image, "disk.raw")},format=raw,if=virtio,snapshot=on`,
    "-drive",
    `file=${seedImage},format=raw,if=virtio,readonly=on`,
    "-netdev",
    `user,id=n0,restrict=on,${guestfwd}`,
    "-device",
    "virtio-net-pci,netdev=n0",
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
