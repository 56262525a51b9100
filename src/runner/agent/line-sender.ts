/**
 * The agent's step between a job's pipes and the runner client: each pipe's bytes cut into
 * lines, every line masked (declared secrets and `::add-mask::` values) before the spool, the
 * network and the local echo see it, and the lines of a pipe read that need no masking handed
 * to the client in one call (docs/decisions/log-masking.md, "Runs of lines").
 */
import { Buffer } from "node:buffer";
import type { RunnerClient } from "../client/runner-client.js";
import { createLineSplitter, type LineSplitter } from "./line-splitter.js";
import { MASK_TEXT, MIN_SECRET_BYTES, safeCut, type SecretMasker } from "../masking/secret-masker.js";
import {
  ADD_MASK_PREFIX,
  addMaskValue,
  maskLine,
  maskLineBytes,
  mayBeAddMask,
  registerMask,
} from "../masking/add-mask.js";

/** Options of {@link createLineSender}. */
export interface LineSenderOptions {
  /** The job's masker: its declared values, and what `::add-mask::` lines register. */
  masker: SecretMasker;
  /** Longest line in UTF-8 bytes; longer ones are cut, never inside a secret. */
  maxLineBytes: number;
  /** Every line as masked text (turns the byte path off). */
  onLine?: (line: string, stderr: boolean, time: number) => void;
  /** The masked output as bytes, whole lines with their newlines (the caller's to keep). */
  onOutput?: (bytes: Buffer, stderr: boolean) => void;
  /** True once the job was stopped: lines are dropped from then on. */
  stopped(): boolean;
  /** Told what each hand-over to the client returned: false when its spool is over the high-water mark. */
  accepted(ok: boolean): void;
}

/** What {@link createLineSender} returns. */
export interface LineSender {
  /** Splits, masks and sends the job's stdout. */
  readonly stdout: LineSplitter;
  /** Splits, masks and sends the job's stderr. */
  readonly stderr: LineSplitter;
  /**
   * When the pipe read being pushed happened (ms since the epoch, to the µs): the stamp of every line it completes, so
   * a line split across reads gets the read that ended it (docs/runner-protocol.md §2, "Line times"). Set it before
   * each push and end.
   */
  readAt: number;
}

/**
 * Creates the step for one job.
 *
 * @example
 * const sender = createLineSender(client, { masker, maxLineBytes, stopped: () => false, accepted: () => {} });
 * sender.readAt = nowMs();
 * sender.stdout.push(chunk);
 */
export function createLineSender(client: RunnerClient, options: LineSenderOptions): LineSender {
  const { masker, maxLineBytes, stopped, accepted } = options;
  const echo = options.onOutput;
  // Lines that are valid UTF-8 within the limit go to the client as bytes (no string per
  // line) unless the caller wants every line as text.
  const logUtf8 =
    options.onLine === undefined && client.logUtf8 !== undefined ? client.logUtf8.bind(client) : undefined;
  // Runs of plain lines (no command, no secret in any form) go to the client in one call.
  const logLines = logUtf8 !== undefined && client.logLines !== undefined ? client.logLines.bind(client) : undefined;
  const refused = (why: string) => sendLine(`runner-depot: ::add-mask:: value not registered: ${why}`, true);

  const sendLine = (raw: string, stderr: boolean) => {
    if (stopped()) return;
    const line = maskLine(masker, raw, refused);
    options.onLine?.(line, stderr, sender.readAt);
    echo?.(Buffer.from(`${line}\n`, "utf8"), stderr);
    accepted(client.log(line, stderr, sender.readAt));
  };
  const sendBytes = (buf: Buffer, start: number, end: number, stderr: boolean) => {
    if (stopped()) return;
    const masked = maskLineBytes(masker, buf, start, end, refused);
    if (masked !== null) {
      buf = masked;
      start = 0;
      end = masked.length;
    }
    if (echo !== undefined) echo(withNewline(buf, start, end), stderr);
    accepted(logUtf8!(buf, start, end, stderr, sender.readAt));
  };
  // The lines before the first command or secret form of the run go whole; from the line holding it on, line by line
  // (a command registers a value for the lines after it, and a line holding a secret is masked on its own).
  const sendRun = (buf: Buffer, start: number, end: number, stderr: boolean, commands: CommandSearch): number => {
    if (stopped()) return end;
    const plainEnd = plainLinesEnd(masker, commands, buf, start, end);
    if (plainEnd === start) return start;
    const taken = logLines!(buf, start, plainEnd, stderr, sender.readAt, maxLineBytes);
    // A copy: the pipe's next read takes this memory.
    if (echo !== undefined && taken.next > start) echo(Buffer.from(buf.subarray(start, taken.next)), stderr);
    accepted(taken.accepted);
    return taken.next;
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
  const splitter = (stderr: boolean): LineSplitter => {
    // Where the read's next `::add-mask::` is, from where it was looked for: the splitter comes back after each line
    // that went alone, and a search to the read's end each time would be O(lines × bytes) a read. Forgotten with
    // every read: the pipe's next read may come in the same buffer.
    const commands: CommandSearch = { buf: null, from: 0, at: -1 };
    const lines = createLineSplitter((line) => sendLine(line, stderr), {
      maxLineBytes,
      masking,
      onBytes: logUtf8 && ((buf, start, end) => sendBytes(buf, start, end, stderr)),
      onRun: logLines && ((buf, start, end) => sendRun(buf, start, end, stderr, commands)),
    });
    return {
      push(chunk) {
        commands.buf = null;
        lines.push(chunk);
      },
      end() {
        commands.buf = null;
        lines.end();
      },
    };
  };
  const sender: LineSender = { stdout: splitter(false), stderr: splitter(true), readAt: 0 };
  return sender;
}

/** The last search for `::add-mask::` in a read: in `buf`, from `from`, found at `at` (-1: none to the end). */
interface CommandSearch {
  buf: Buffer | null;
  from: number;
  at: number;
}

/**
 * The first `::add-mask::` at or after `start` in `buf`, or -1. The answer for a later `start` up to the one found
 * is the same, so a read is searched once a command it holds (the pipe's next read reuses `buf`'s memory: a new
 * search whenever `start` goes back). O(bytes to the next command), O(1) when remembered.
 */
function nextCommand(search: CommandSearch, buf: Buffer, start: number): number {
  if (search.buf !== buf || start < search.from || (search.at !== -1 && start > search.at)) {
    search.buf = buf;
    search.from = start;
    search.at = buf.indexOf(ADD_MASK_PREFIX, start, "latin1");
  }
  return search.at;
}

/**
 * Where the lines of `buf[start, end)` (complete lines) that need no masking end: the start of the line holding the
 * first `::add-mask::` or the first form of a secret, or `end`. O(bytes to the first hit) typical.
 */
function plainLinesEnd(masker: SecretMasker, commands: CommandSearch, buf: Buffer, start: number, end: number): number {
  const command = nextCommand(commands, buf, start);
  const beforeCommand = command === -1 || command >= end ? end : command;
  // Forms are looked for before the command only, and up to the first: from its line on, lines go one by one anyway.
  const form = masker.firstRunStart(buf, start, beforeCommand);
  const hit = form === -1 ? beforeCommand : form;
  if (hit === end) return end;
  // From the line holding the hit's first byte; a form that begins with a newline sends the line it ends one by one too.
  // The guard matters: lastIndexOf(…, -1) would search back from the buffer's end.
  return hit <= start ? start : Math.max(start, buf.lastIndexOf(0x0a, hit - 1) + 1);
}

/** A copy of `src[start, end)` with a newline after it. O(bytes). */
function withNewline(src: Buffer, start: number, end: number): Buffer {
  const out = Buffer.allocUnsafe(end - start + 1);
  src.copy(out, 0, start, end);
  out[end - start] = 0x0a;
  return out;
}
