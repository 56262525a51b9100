/**
 * The data folder's lock for `serve`: one server per data folder. A second `serve` on the
 * same folder would overwrite `serve.json` (same admin token), then delete it on exit and
 * hide the first server; instead it refuses, naming the first one's PID and URLs.
 *
 * The lock is `<data>/serve.lock`, created exclusively (O_EXCL) and holding the owner's
 * PID. A lock whose PID no longer runs (a server killed with -9) is stale and taken over.
 */
import { open, readFile, rm } from "node:fs/promises";
import path from "node:path";
import { CliError, readServeState } from "../args.js";

/** The lock file's name inside the data folder. */
const SERVE_LOCK = "serve.lock";

/** True when a process with this PID exists (EPERM: it exists but is not ours). */
function pidAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * Takes the data folder's lock for this process, or throws a CliError naming the
 * server that holds it. Returns the release function (removes the lock if still ours).
 *
 * @example
 * const release = await lockDataDir("./.runner-depot");
 * try { … serve … } finally { await release(); }
 */
export async function lockDataDir(dataDir: string): Promise<() => Promise<void>> {
  const lock = path.join(dataDir, SERVE_LOCK);
  // Two rounds at most: the second follows the removal of a stale lock.
  for (let round = 0; round < 2; round++) {
    try {
      const fh = await open(lock, "wx", 0o600);
      try {
        await fh.writeFile(`${process.pid}\n`);
      } finally {
        await fh.close();
      }
      return async () => {
        // Only our own lock: a takeover after we hung must not be undone by us.
        const owner = Number((await readFile(lock, "utf8").catch(() => "")).trim());
        if (owner === process.pid) await rm(lock, { force: true });
      };
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
    }
    const pid = await lockOwner(lock);
    if (pidAlive(pid)) throw await heldBy(dataDir, lock, pid);
    // Stale: its process is gone, or died between creating and writing it.
    await rm(lock, { force: true });
  }
  throw new CliError(`another 'runner-depot serve' keeps taking ${lock}; stop it first`);
}

/** The PID in the lock; an empty lock is re-read for a moment (its owner may be between create and write). */
async function lockOwner(lock: string): Promise<number> {
  for (let attempt = 0; attempt < 20; attempt++) {
    const text = (await readFile(lock, "utf8").catch(() => "")).trim();
    if (text !== "") return Number(text);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  return 0;
}

async function heldBy(dataDir: string, lock: string, pid: number): Promise<CliError> {
  const state = await readServeState(dataDir);
  const where =
    state && state.pid === pid
      ? `runner (gRPC) ${state.runnerUrl}, depot (HTTP) ${state.depotUrl}`
      : "still starting, no URLs yet";
  return new CliError(
    `another 'runner-depot serve' (pid ${pid}) already uses ${dataDir}: ${where}; stop it first, or pass --data <dir> for a second server (a lock left by a dead server is taken over: ${lock})`,
  );
}
