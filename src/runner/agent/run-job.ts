/**
 * The runner agent's job loop: spawn the job's process, stream its stdout and stderr
 * lines through a RunnerClient in the order they are observed, send the job end with
 * the exit code, and kill the process when the orchestrator no longer wants the job.
 */
import { spawn } from "node:child_process";
import { constants as osConstants } from "node:os";
import { RunnerDepotError } from "../../errors.js";
import type { RunnerClient, RunnerStop } from "../client/runner-client.js";
import { DEFAULT_MAX_LINE_BYTES, type LineSplitter } from "./line-splitter.js";
import { createLineSender } from "./line-sender.js";
import { readPipe } from "./pipe-reader.js";
import { nowMs } from "../protocol/line-time.js";
import { createSecretMasker } from "../masking/secret-masker.js";

/** Options of {@link runJob}. */
export interface RunJobOptions {
  /** Program to run (looked up on PATH). */
  command: string;
  /** Its arguments. */
  args?: readonly string[];
  /** Working directory. */
  cwd?: string;
  /** Environment; default the agent's own. */
  env?: NodeJS.ProcessEnv;
  /** Sent with the job end (context for the integration layer). */
  repoUrl?: string;
  /** Sent with the job end. */
  commitSha?: string;
  /** Longest line in UTF-8 bytes; longer ones are split. Default 64 KiB. */
  maxLineBytes?: number;
  /** After SIGTERM, wait this long before SIGKILL. Default 10 000 ms. */
  killGraceMs?: number;
  /** Signal the whole process group (the job's children too). Default true. */
  killProcessGroup?: boolean;
  /**
   * Called with every line as it is streamed, masked (e.g. to show the job's output locally too), with the time the agent
   * read it from the pipe (ms since the epoch, to the µs: the line's stamp).
   */
  onLine?: (line: string, stderr: boolean, time: number) => void;
  /**
   * Called with the output as it is streamed, masked, as bytes: whole lines each ended by `\n` (a line over the limit
   * in its pieces). The lines a pipe read completes come in one or two calls where none needs masking (the line the
   * last read left open, then the rest), one call a line from a line that does (e.g. to echo the job's output with a
   * write or so a read). The bytes are the caller's to keep. Unlike `onLine`, it keeps lines out of strings.
   */
  onOutput?: (bytes: Buffer, stderr: boolean) => void;
  /**
   * Secret values masked in every line before it leaves the agent (docs/runner-protocol.md §14);
   * each at least 4 bytes, else INVALID_ARGUMENT before the job starts. The job adds more
   * with `::add-mask::VALUE` lines.
   */
  secrets?: readonly string[];
}

/**
 * Runs a job's process and streams its output; resolves with its exit code
 * (128 + signal number when a signal ended it).
 *
 * When the orchestrator stops the job (Ack ok = false) the process is sent SIGTERM,
 * then SIGKILL after `killGraceMs`, no end item is sent, and the promise resolves with
 * the killed process's exit code. When the client gives up (e.g. PERMISSION_DENIED) the
 * process is killed the same way and the promise rejects with the client's error.
 *
 * @example
 * const client = createRunnerClient({ endpoint, requestId, token });
 * const exitCode = await runJob(client, { command: "make", args: ["test"], repoUrl, commitSha });
 * await client.close();
 */
export async function runJob(client: RunnerClient, options: RunJobOptions): Promise<number> {
  const maxLineBytes = options.maxLineBytes ?? DEFAULT_MAX_LINE_BYTES;
  const killGraceMs = options.killGraceMs ?? 10_000;
  const group = options.killProcessGroup ?? process.platform !== "win32";
  let stop: RunnerStop | null = null;
  // Before spawning: a refused secret must not cost a job run with it in clear.
  const masker = createSecretMasker(options.secrets ?? []);

  const child = spawn(options.command, options.args ?? [], {
    cwd: options.cwd,
    env: options.env,
    stdio: ["ignore", "pipe", "pipe"],
    // Its own process group, so a kill reaches the job's children too.
    detached: group,
  });

  const spawned = await new Promise<Error | null>((resolve) => {
    child.once("spawn", () => resolve(null));
    child.once("error", (e) => resolve(e));
  });
  if (spawned !== null) {
    // The job could not start: say why in its log and report it as failed, as a shell would (127).
    client.log(masker.mask(`runner-depot: cannot start ${options.command}: ${spawned.message}`), true);
    await client.end({
      exitCode: 127,
      success: false,
      repoUrl: masker.mask(options.repoUrl ?? ""),
      commitSha: masker.mask(options.commitSha ?? ""),
    });
    return 127;
  }

  let paused = false;
  const pauseForSpool = (accepted: boolean) => {
    if (accepted || paused) return;
    // The spool is full (server unreachable): stop reading, so the job blocks on its pipe
    // instead of the agent growing without bound.
    paused = true;
    outPipe.pause();
    errPipe.pause();
    void client.drained().then(() => {
      paused = false;
      outPipe.resume();
      errPipe.resume();
    });
  };
  // Masked here, before the spool, the network and the local echo see a line.
  const sender = createLineSender(client, {
    masker,
    maxLineBytes,
    onLine: options.onLine,
    onOutput: options.onOutput,
    stopped: () => stop !== null,
    accepted: pauseForSpool,
  });
  // Each pipe read into one reused buffer (the splitter copies what it keeps); a read stamps the time.
  const readInto = (pipe: NonNullable<typeof child.stdout>, splitter: LineSplitter) =>
    readPipe(
      pipe,
      (b) => {
        sender.readAt = nowMs();
        splitter.push(b);
      },
      () => {
        sender.readAt = nowMs();
        splitter.end();
      },
    );
  const outPipe = readInto(child.stdout!, sender.stdout);
  const errPipe = readInto(child.stderr!, sender.stderr);

  const exited = new Promise<number>((resolve) => {
    child.once("close", (code, signal) => {
      if (code !== null) resolve(code);
      else resolve(128 + (signal ? (osConstants.signals[signal] ?? 0) : 0));
    });
  });
  // The child's `close` no longer waits for the pipes readPipe took over: the job is over when both are read too.
  const closed = Promise.all([exited, outPipe.done, errPipe.done]).then(([code]) => code);

  let killTimer: NodeJS.Timeout | undefined;
  const kill = (signal: NodeJS.Signals) => {
    try {
      if (group && child.pid !== undefined) process.kill(-child.pid, signal);
      else child.kill(signal);
    } catch {
      // Already gone.
    }
  };
  const unsubscribe = client.onStop((s) => {
    stop = s;
    kill("SIGTERM");
    killTimer = setTimeout(() => kill("SIGKILL"), killGraceMs);
  });

  try {
    const exitCode = await closed;
    clearTimeout(killTimer);
    const stopped = stop as RunnerStop | null;
    if (stopped !== null) {
      if (stopped.reason === "failed")
        throw stopped.error ?? new RunnerDepotError("UNAVAILABLE", "the runner client gave up");
      return exitCode;
    }
    try {
      await client.end({
        exitCode,
        success: exitCode === 0,
        repoUrl: masker.mask(options.repoUrl ?? ""),
        commitSha: masker.mask(options.commitSha ?? ""),
      });
    } catch (e) {
      const late = stop as RunnerStop | null;
      // Stopped by the orchestrator while the end was in flight: the job is over either way.
      if (late !== null && late.reason !== "failed") return exitCode;
      throw e;
    }
    return exitCode;
  } finally {
    unsubscribe();
    clearTimeout(killTimer);
  }
}
