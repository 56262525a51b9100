/**
 * Child processes the depot benchmarks share: the depot fixture server, a wait for a
 * peer's port, and a stop that waits for the exit.
 */
import { spawn, type ChildProcess } from "node:child_process";
import net from "node:net";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const serverScript = path.join(
  path.dirname(fileURLToPath(import.meta.url)),
  "..",
  "test",
  "fixtures",
  "depot-client-server.ts",
);

/** Waits until something listens on 127.0.0.1:`port`, failing when `child` exits first. */
export async function waitForPort(port: number, child: ChildProcess): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if (child.exitCode !== null) throw new Error(`process exited with ${child.exitCode}`);
    const ok = await new Promise<boolean>((resolve) => {
      const socket = net.connect(port, "127.0.0.1", () => {
        socket.end();
        resolve(true);
      });
      socket.once("error", () => resolve(false));
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`nothing listens on 127.0.0.1:${port}`);
}

/** SIGTERM, then waits for the exit (nothing when already gone). */
export async function stop(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  await exited;
}

/**
 * Starts the depot fixture server (fs store in `dir`) in a child process; `noSync` runs the
 * store without fsync (its `unsafeNoSync` option), for rows measured against peers that
 * never sync; `hashOnWorker` turns its hashing worker on (`hashOnWorker: true`).
 */
export async function startDepot(
  dir: string,
  options: { noSync?: boolean; hashOnWorker?: boolean } = {},
): Promise<{ url: string; child: ChildProcess }> {
  const args = [
    "--import",
    "tsx",
    serverScript,
    dir,
    ...(options.noSync ? ["--unsafe-no-sync"] : []),
    ...(options.hashOnWorker ? ["--hash-on-worker"] : []),
  ];
  const child = spawn(process.execPath, args, { stdio: ["pipe", "pipe", "inherit"] });
  const line = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).once("line", resolve);
    child.once("exit", (code) => reject(new Error(`depot server exited with ${code}`)));
  });
  return { url: (JSON.parse(line) as { url: string }).url, child };
}
