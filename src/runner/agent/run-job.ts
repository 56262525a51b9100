/**
 * The runner agent's job loop: spawn the job's process, stream its stdout and stderr
 * lines through a RunnerClient in the order they are observed, send the job end with
 * the exit code, and kill the process when the orchestrator no longer wants the job.
 */
import { spawn } from "node:child_process";
import { constants as osConstants } from "node:os";
import { RunnerDepotError } from "../../errors.js";
import type { RunnerClient, RunnerStop } from "../client/runner-client.js";
import { createLineSplitter, DEFAULT_MAX_LINE_BYTES } from "./line-splitter.js";
import { readPipe } from "./pipe-reader.js";
import { nowMs } from "../protocol/line-time.js";
import { createSecretMasker, MASK_TEXT, MIN_SECRET_BYTES, safeCut } from "../masking/secret-masker.js";
import {
  ADD_MASK_PREFIX,
  addMaskValue,
  maskLine,
  maskLineBytes,
  mayBeAddMask,
  registerMask,
} from "../masking/add-mask.js";

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
   * in its pieces), the lines of a pipe read in one call where none needs masking (e.g. to echo the job's output with
   * one write a read). The bytes are the caller's to keep. Unlike `onLine`, it keeps lines out of strings.
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
  // Lines that are valid UTF-8 within the limit go to the client as bytes (no string per
  // line) unless the caller wants every line as text.
  const logUtf8 =
    options.onLine === undefined && client.logUtf8 !== undefined ? client.logUtf8.bind(client) : undefined;
  // Runs of plain lines (no command, no secret in any form) go to the client in one call a pipe read.
  const logLines = logUtf8 !== undefined && client.logLines !== undefined ? client.logLines.bind(client) : undefined;
  // When the pipe read that completes a line happened: every line of one read shares it (one clock read a
  // read, not a line), and a line split across reads gets the read that ended it (docs/runner-protocol.md §2, "Line times").
  let readAt = 0;
  const echo = options.onOutput;
  const refused = (why: string) => sendLine(`runner-depot: ::add-mask:: value not registered: ${why}`, true);
  // A line is masked here, before the spool, the network and the local echo see it.
  const sendLine = (raw: string, stderr: boolean) => {
    if (stop !== null) return;
    const line = maskLine(masker, raw, refused);
    options.onLine?.(line, stderr, readAt);
    echo?.(Buffer.from(`${line}\n`, "utf8"), stderr);
    pauseForSpool(client.log(line, stderr, readAt));
  };
  const sendBytes = (buf: Buffer, start: number, end: number, stderr: boolean) => {
    if (stop !== null) return;
    const masked = maskLineBytes(masker, buf, start, end, refused);
    if (masked !== null) {
      buf = masked;
      start = 0;
      end = masked.length;
    }
    if (echo !== undefined) echo(withNewline(buf, start, end), stderr);
    pauseForSpool(logUtf8!(buf, start, end, stderr, readAt));
  };
  // Whole when no line of the run needs masking: a command registers a value for the lines after it, and a line
  // holding a secret is masked on its own, so either sends the run line by line (returns `start`). O(run bytes).
  const sendRun = (buf: Buffer, start: number, end: number, stderr: boolean): number => {
    if (stop !== null) return end;
    const command = buf.indexOf(ADD_MASK_PREFIX, start, "latin1");
    if ((command !== -1 && command < end) || masker.runs(buf, start, end) !== null) return start;
    const { next, accepted } = logLines!(buf, start, end, stderr, readAt, maxLineBytes);
    // A copy: the pipe's next read takes this memory.
    if (echo !== undefined && next > start) echo(Buffer.from(buf.subarray(start, next)), stderr);
    pauseForSpool(accepted);
    return next;
  };
  // A line over the limit is cut in pieces: the cut never falls inside a secret.
  // A command line over the limit registers its whole value before it is cut; one cut before its newline
  // (no end seen yet) registers each piece of its value as it goes, and shows `***` for it.
  const masking = {
    text: (line: string) => maskLine(masker, line, refused),
    cut: safeCut.bind(null, masker),
    command: (buf: Buffer, start: number, end: number) =>
      mayBeAddMask(buf, start, end) && addMaskValue(buf.toString("utf8", start, end)) !== null,
    value: (piece: string) => {
      if (Buffer.byteLength(piece, "utf8") >= MIN_SECRET_BYTES) {
        const why = registerMask(masker, piece);
        if (why !== null) refused(why);
      }
      return MASK_TEXT;
    },
  };
  const out = createLineSplitter((line) => sendLine(line, false), {
    maxLineBytes,
    masking,
    onBytes: logUtf8 && ((buf, start, end) => sendBytes(buf, start, end, false)),
    onRun: logLines && ((buf, start, end) => sendRun(buf, start, end, false)),
  });
  const err = createLineSplitter((line) => sendLine(line, true), {
    maxLineBytes,
    masking,
    onBytes: logUtf8 && ((buf, start, end) => sendBytes(buf, start, end, true)),
    onRun: logLines && ((buf, start, end) => sendRun(buf, start, end, true)),
  });
  // Each pipe read into one reused buffer (the splitter copies what it keeps); a read stamps the time.
  const readInto = (pipe: NonNullable<typeof child.stdout>, splitter: typeof out) =>
    readPipe(
      pipe,
      (b) => {
        readAt = nowMs();
        splitter.push(b);
      },
      () => {
        readAt = nowMs();
        splitter.end();
      },
    );
  const outPipe = readInto(child.stdout!, out);
  const errPipe = readInto(child.stderr!, err);

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

/** A copy of `src[start, end)` with a newline after it. O(bytes). */
function withNewline(src: Buffer, start: number, end: number): Buffer {
  const out = Buffer.allocUnsafe(end - start + 1);
  src.copy(out, 0, start, end);
  out[end - start] = 0x0a;
  return out;
}
