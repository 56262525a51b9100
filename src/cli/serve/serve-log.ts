/**
 * `serve`'s logger: pino writing JSON lines to stderr (stdout carries job results), or,
 * on a terminal, the same lines made readable by {@link formatLogLine} — a few dozen lines
 * of our own instead of pino-pretty, which would bring a dozen packages and a worker
 * thread for one colourless line per event (docs/decisions/operations.md).
 */
import { pino, type Logger as PinoLogger } from "pino";
import type { Logger } from "../../telemetry.js";
import { CliError } from "../args.js";

/** The levels `--log-level` takes (pino's names). */
const LOG_LEVELS = ["trace", "debug", "info", "warn", "error", "fatal", "silent"] as const;

const LEVEL_NAMES: Record<number, string> = {
  10: "TRACE",
  20: "DEBUG",
  30: "INFO",
  40: "WARN",
  50: "ERROR",
  60: "FATAL",
};
/** Fields every pino line has, shown in the line's head rather than as key=value. */
const HEAD_FIELDS = new Set(["level", "time", "msg", "pid", "hostname"]);

/**
 * One pino JSON line as `HH:MM:SS.mmm LEVEL message key=value …` on one line: values are
 * JSON (strings quoted only when they hold a space, a quote, `=` or a control character),
 * so a value can never start a new line or pose as another field. A line that is not a
 * JSON object is returned as it was, with its control characters escaped. O(line length).
 *
 * @example
 * formatLogLine('{"level":30,"time":0,"msg":"depot listening","url":"http://127.0.0.1:8080"}');
 * // "00:00:00.000 INFO  depot listening url=http://127.0.0.1:8080"
 */
export function formatLogLine(line: string): string {
  let record: unknown;
  try {
    record = JSON.parse(line);
  } catch {
    return escapeControls(line);
  }
  if (record === null || typeof record !== "object" || Array.isArray(record)) return escapeControls(line);
  const fields = record as Record<string, unknown>;
  const time = typeof fields.time === "number" && Number.isFinite(fields.time) ? new Date(fields.time) : undefined;
  const clock = time && !Number.isNaN(time.getTime()) ? time.toISOString().slice(11, 23) : "--:--:--.---";
  const level = (typeof fields.level === "number" ? LEVEL_NAMES[fields.level] : undefined) ?? "LOG";
  const message = typeof fields.msg === "string" ? escapeControls(fields.msg) : "";
  const rest = Object.entries(fields)
    .filter(([key]) => !HEAD_FIELDS.has(key))
    .map(([key, value]) => `${escapeControls(key)}=${show(value)}`);
  return [clock, level.padEnd(5), message, ...rest].filter((part) => part !== "").join(" ");
}

function show(value: unknown): string {
  if (typeof value === "string" && /^[^\s"=\u0000-\u001f\u007f-\u009f\u2028\u2029]+$/.test(value)) return value;
  // JSON.stringify escapes C0 controls only: DEL, the C1 controls and U+2028/2029 pass
  // through it (a string value of "\u007f" came out raw), so they are escaped here.
  return escapeControls(JSON.stringify(value) ?? "null");
}

function escapeControls(text: string): string {
  return text.replace(
    /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g,
    (ch) => `\\u${ch.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

/** Options of {@link createServeLogger}. */
interface ServeLoggerOptions {
  /** `--log-level`; default info. */
  level?: string;
  /** `--log-format`: json, or pretty (readable); default pretty on a terminal, else json. */
  format?: string;
  /** Where lines go; default process.stderr. */
  stream?: NodeJS.WritableStream & { isTTY?: boolean };
}

/**
 * The serve command's pino logger.
 *
 * @example
 * const logger = createServeLogger({ level: "debug" });
 * logger.info({ url }, "depot listening");
 */
export function createServeLogger(options: ServeLoggerOptions = {}): PinoLogger {
  const level = options.level ?? "info";
  if (!(LOG_LEVELS as readonly string[]).includes(level))
    throw new CliError(`--log-level must be one of ${LOG_LEVELS.join(", ")}`, 2);
  const stream = options.stream ?? process.stderr;
  const format = options.format ?? (stream.isTTY ? "pretty" : "json");
  if (format !== "json" && format !== "pretty") throw new CliError("--log-format must be json or pretty", 2);
  // pino writes each line with one synchronous write() call on a plain destination object.
  const destination =
    format === "json" ? stream : { write: (line: string) => stream.write(`${formatLogLine(line.trimEnd())}\n`) };
  return pino(
    { level, base: { pid: process.pid }, serializers: { err: pino.stdSerializers.err } },
    destination as NodeJS.WritableStream,
  );
}

/**
 * `logger` with a switch: once `gate.quiet` is set, it and every child it made say
 * nothing. serve sets it when its start failed, so closing what it had opened (a runner
 * server's drain lines) does not follow the CLI's one-line error.
 *
 * @example
 * const gate = { quiet: false };
 * const log = gatedLogger(createServeLogger(), gate);
 * gate.quiet = true; // from here on, nothing
 */
export function gatedLogger(logger: Logger, gate: { quiet: boolean }): Logger {
  return {
    child: (bindings) => gatedLogger(logger.child(bindings), gate),
    debug: (fields, message) => gate.quiet || logger.debug(fields, message),
    info: (fields, message) => gate.quiet || logger.info(fields, message),
    warn: (fields, message) => gate.quiet || logger.warn(fields, message),
    error: (fields, message) => gate.quiet || logger.error(fields, message),
  };
}

/**
 * Sends this package's own process warnings (code `RUNNER_DEPOT_…`: a filesystem that
 * cannot fsync a directory, durable.ts) to `logger` at warn, with their code, until the
 * returned undo is called. The stores have no logger and warn through the process, which
 * Node prints as a plain line beside serve's JSON lines, or not at all under
 * `--no-warnings` / NODE_NO_WARNINGS; the event is emitted either way. O(1) a warning.
 *
 * @example
 * const stop = logPackageWarnings(logger);
 * // … serve …
 * stop();
 */
export function logPackageWarnings(logger: Logger): () => void {
  const onWarning = (warning: Error & { code?: unknown }) => {
    if (typeof warning.code === "string" && warning.code.startsWith("RUNNER_DEPOT_"))
      logger.warn({ code: warning.code }, warning.message);
  };
  process.on("warning", onWarning);
  return () => {
    process.off("warning", onWarning);
  };
}
