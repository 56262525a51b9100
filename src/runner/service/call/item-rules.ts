/**
 * The rules applied to each item of a call (docs/runner-protocol.md, §3–§4): its size,
 * its request_id, its position against what is stored, a line's cut and the job's byte
 * cap, and the end item that publishes the job's result.
 */
import { RunnerDepotError } from "../../../errors.js";
import type { JobEnd, LogItem } from "../../../gen/runner/v1/runner_pb.js";
import type { LogEntry, StoredLine } from "../../ports.js";
import type { CallRun } from "./run.js";
import { uErr, type RunnerCore } from "../job-table.js";
import { EndedSignal, endedReasonOf } from "./ended-signal.js";
import { publishEnd } from "./end-item.js";
import { encodedSize, logItemSize } from "../../protocol/encoded-size.js";
import { cutUtf8 } from "../../agent/line-splitter.js";
import { JOB_END_FIELD_BYTES } from "../contract.js";
import { ReceivedLine, type CallItem } from "../../protocol/received-line.js";
import { ReceivedRun, runRefusal } from "../../protocol/received-run.js";
import { lineCapCost, textCapCost } from "../log-cap.js";
import { lineTime, nanosToMs } from "../../protocol/line-time.js";
import { maskEnd, maskReceived, maskText } from "./masking.js";

const MARKER_PREFIX = "[runner-depot]";

function tooLarge(size: number, maxBytes: number): RunnerDepotError {
  return new RunnerDepotError(
    "RESOURCE_EXHAUSTED",
    `a message of ${size} bytes is over the ${maxBytes}-byte limit; split the line`,
  );
}

/**
 * Applies the rules to one item. Throws (synchronously) on a bad item; returns a
 * promise only when the call has to wait (back-pressure or the end item). O(line length).
 */
export function processItem(core: RunnerCore, call: CallRun, item: CallItem): Promise<void> | undefined {
  const index = call.index++;
  // A run reaches the rules whole only to be refused: the item reader hands over the lines of the runs it takes.
  if (!(item instanceof ReceivedLine) && (item instanceof ReceivedRun || item.event.case === "run")) {
    if (index > 0 && item.requestId !== call.rawId && item.requestId.toLowerCase() !== call.id) {
      throw uErr("INVALID_ARGUMENT", "all items of a call must carry the same request_id");
    }
    if (call.endSeen) throw uErr("INVALID_ARGUMENT", "no item may follow the end item");
    throw refuseRun(core, item);
  }
  // A received line is a log item whose line is bytes (the fast path); the rest are messages.
  const received = item instanceof ReceivedLine ? item : null;
  const event = received === null ? (item as LogItem).event : null;
  const kind = received !== null ? "log" : event!.case;
  // The line's UTF-8 size serves both the message limit and the line limit.
  const lineBytes =
    received !== null ? received.size : event!.case === "log" ? Buffer.byteLength(event!.value.line, "utf8") : 0;
  const size =
    received !== null
      ? logItemSize(received.requestId, lineBytes, received.stderr)
      : encodedSize(item as LogItem, lineBytes);
  if (size > call.maxBytes) throw tooLarge(size, call.maxBytes);
  // The same text as the first item's needs no case folding.
  if (index > 0 && item.requestId !== call.rawId && item.requestId.toLowerCase() !== call.id) {
    throw uErr("INVALID_ARGUMENT", "all items of a call must carry the same request_id");
  }
  if (call.endSeen) throw uErr("INVALID_ARGUMENT", "no item may follow the end item");
  if (kind === undefined) throw uErr("INVALID_ARGUMENT", "an item must carry a log line or the job end");
  if (kind === "end") checkEndFields(event!.value as JobEnd);

  const hostReason = endedReasonOf(core, call);
  if (hostReason) throw new EndedSignal(hostReason);
  const pos = call.offset + index;
  if (call.state?.status === "finished") {
    // Duplicates of a finished job are harmless; anything new is refused.
    if (pos < call.state.committed) {
      if (kind === "end") call.endSeen = true;
      return undefined;
    }
    throw new EndedSignal("ended");
  }
  if (index === 0) {
    if (pos > call.committed) {
      throw new RunnerDepotError(
        "FAILED_PRECONDITION",
        `offset ${pos} is past the ${call.committed} items stored; resend from ${call.committed}`,
      );
    }
    call.nextPos = call.committed;
    call.storedBytes = call.state?.storedBytes ?? 0;
    call.cut = call.state?.cut !== undefined;
    // A cut log's `logTruncated` says lines were dropped; only a log without a tail stops storing.
    call.truncated = !call.cut && (call.state?.logTruncated ?? false);
  }
  if (pos < call.nextPos) {
    // A resend of a stored item: skipped, not compared.
    if (kind === "end") call.endSeen = true;
    return undefined;
  }

  if (kind === "log") {
    call.pendingReceivedBytes += lineBytes;
    const log = event?.case === "log" ? event.value : null;
    // The agent's stamp, or (an agent that sends none) the receive time, marked as the server's.
    let time = log === null ? received!.time : nanosToMs(log.timeUnixNano);
    const serverTime = time === 0;
    if (serverTime) time = lineTime(Date.now());
    // Masked before the line limit and the cap see it: masking only shrinks a line (≥ 4 bytes → 3).
    if (log === null) {
      const masked = maskReceived(core, call.id, received!);
      masked.time = time;
      masked.serverTime = serverTime;
      return call.enqueue(receivedEntry(core, call, masked, masked === received ? lineBytes : masked.size));
    }
    const text = maskText(core, call.id, log.line);
    const bytes = text === log.line ? lineBytes : Buffer.byteLength(text, "utf8");
    return call.enqueue(entryFor(core, call, text, log.stderr, bytes, time, serverTime));
  }
  call.endSeen = true;
  return processEnd(core, call, maskEnd(core, call.id, event!.value as JobEnd));
}

/**
 * What a received line stores: itself (as its own entry), as bytes, when it is within the line limit and the
 * job's cap (the common case: no string is made); otherwise what {@link entryFor} makes of its text.
 */
function receivedEntry(core: RunnerCore, call: CallRun, line: ReceivedLine, lineBytes: number): LogEntry {
  const limits = core.config.limits;
  const cost =
    call.truncated || lineBytes > limits.lineBytes ? -1 : lineCapCost(line.buf, line.start, line.end, line.plainJson);
  // Once the log is cut every line goes to the store's rolling tail (log-tail.ts): nothing more to count here.
  if (cost < 0 || (!call.cut && call.storedBytes + cost > limits.headBytes)) {
    return entryFor(core, call, line.line, line.stderr, lineBytes, line.time, line.serverTime);
  }
  if (!call.cut) call.storedBytes += cost;
  line.bytes = cost;
  // The line is its own entry (runner/protocol/received-line.ts): no entry object or array a line.
  return line;
}

/** The end item: store what came before, publish, then record. */
async function processEnd(core: RunnerCore, call: CallRun, end: JobEnd): Promise<void> {
  await call.guard(call.flush());
  const at = call.nextPos;
  await call.guard(core.locked(call.id, () => publishEnd(core, call, end, at)));
  call.nextPos = at + 1;
}

/**
 * What a line stores: itself (cut to the line limit, with a marker), or a cap marker, or nothing past the cap. Every
 * line stored carries the item's time (markers too: they say what happened to that line).
 */
function entryFor(
  core: RunnerCore,
  call: CallRun,
  line: string,
  stderr: boolean,
  lineBytes: number,
  time: number,
  serverTime: boolean,
): LogEntry {
  const limits = core.config.limits;
  if (call.truncated) return { stored: [], stderr, bytes: 0 };
  let text = line;
  let bytes = lineBytes;
  const stored: StoredLine[] = [];
  let marker: StoredLine | null = null;
  if (bytes > limits.lineBytes) {
    const cut = cutUtf8(line, limits.lineBytes);
    marker = timed(
      { line: `${MARKER_PREFIX} line truncated: ${bytes} bytes, kept ${cut.bytes}`, stderr, marker: true },
      time,
      serverTime,
    );
    text = cut.text;
    bytes = cut.bytes;
  }
  // What the item counts toward the cap (log-cap.ts): the line and its marker, as stored.
  let cost = textCapCost(text, bytes);
  if (marker) cost += textCapCost(marker.line);
  if (call.cut) {
    stored.push(timed({ line: text, stderr }, time, serverTime));
    if (marker) stored.push(marker);
    return { stored, stderr, bytes: cost };
  }
  if (call.storedBytes + cost > limits.headBytes && limits.tailBytes > 0) {
    // The head's share is full: this item starts the tail; the store puts the drop marker before it.
    call.cut = true;
    stored.push(timed({ line: text, stderr }, time, serverTime));
    if (marker) stored.push(marker);
    return { stored, stderr, bytes: cost, capped: true, tailBytes: limits.tailBytes };
  }
  if (call.storedBytes + cost > limits.headBytes) {
    call.truncated = true;
    return {
      stored: [
        timed(
          {
            line: `${MARKER_PREFIX} log truncated: the job log reached its ${limits.headBytes}-byte limit; later lines are counted, not stored`,
            stderr,
            marker: true,
          },
          time,
          serverTime,
        ),
      ],
      stderr,
      bytes: 0,
      capped: true,
    };
  }
  stored.push(timed({ line: text, stderr }, time, serverTime));
  if (marker) stored.push(marker);
  call.storedBytes += cost;
  return { stored, stderr, bytes: cost };
}

/** `line` with its time (and the server-time mark when set). O(1). */
function timed(line: StoredLine, time: number, serverTime: boolean): StoredLine {
  line.time = time;
  if (serverTime) line.serverTime = true;
  return line;
}

/**
 * Why a run handed to the rules whole is refused (INVALID_ARGUMENT): a server that does not take runs answers as
 * one built from the seed's proto would; else the run is empty or over MAX_RUN_LINES. O(1).
 */
function refuseRun(core: RunnerCore, run: ReceivedRun | LogItem): RunnerDepotError {
  const count = run instanceof ReceivedRun ? run.count : run.event.case === "run" ? run.event.value.lines.length : 0;
  const why = core.config.acceptRuns ? runRefusal(count) : null;
  return uErr("INVALID_ARGUMENT", why ?? "an item must carry a log line or the job end");
}

/** The first item's own checks (size, an event present), for an answer given before processItem runs. */
export function checkItemShape(core: RunnerCore, call: CallRun, item: CallItem): void {
  if (item instanceof ReceivedLine) {
    const size = logItemSize(item.requestId, item.size, item.stderr);
    if (size > call.maxBytes) throw tooLarge(size, call.maxBytes);
    return;
  }
  if (item instanceof ReceivedRun || item.event.case === "run") throw refuseRun(core, item);
  const event = item.event;
  const size = encodedSize(item, event.case === "log" ? Buffer.byteLength(event.value.line, "utf8") : 0);
  if (size > call.maxBytes) throw tooLarge(size, call.maxBytes);
  if (event.case === undefined) throw uErr("INVALID_ARGUMENT", "an item must carry a log line or the job end");
  if (event.case === "end") checkEndFields(event.value);
}

/** INVALID_ARGUMENT when the end's repo_url or commit_sha is over its limit (JOB_END_FIELD_BYTES). O(field length). */
function checkEndFields(end: JobEnd): void {
  const repoUrl = Buffer.byteLength(end.repoUrl, "utf8");
  if (repoUrl > JOB_END_FIELD_BYTES.repoUrl)
    throw uErr("INVALID_ARGUMENT", `repo_url is ${repoUrl} bytes, over the ${JOB_END_FIELD_BYTES.repoUrl}-byte limit`);
  const commitSha = Buffer.byteLength(end.commitSha, "utf8");
  if (commitSha > JOB_END_FIELD_BYTES.commitSha)
    throw uErr(
      "INVALID_ARGUMENT",
      `commit_sha is ${commitSha} bytes, over the ${JOB_END_FIELD_BYTES.commitSha}-byte limit`,
    );
}
