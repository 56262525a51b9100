/**
 * The console's job endpoints: the list, one job's summary, a window of its stored lines
 * (the viewer fetches only what is on screen), its sections, the live tail as Server-Sent
 * Events, the raw log download (whole or one section) and cancel.
 *
 * Costs: a window is one `logs.read(from, limit)` (O(limit) on the fs and PostgreSQL
 * stores); the event stream reads through `runner.follow()` from the client's position,
 * so a reconnect costs what it missed, never the whole log.
 */
import { logPages } from "../runner/service/log-pages.js";
import { RunnerDepotError } from "../errors.js";
import { summarizeJob } from "../runner/service/job-list.js";
import { emptySections, sectionLines } from "../runner/service/log-sections.js";
import type { RunnerService } from "../runner/service/runner-service.js";
import type { JobStatus, StoredLine } from "../runner/ports.js";
import { normalizeRequestId } from "../runner/protocol/request-id.js";
import { searchJobLog, searchRequestOf } from "../runner/service/log-search.js";
import { rfc3339Micro } from "../runner/protocol/line-time.js";
import { intParam, json, SECURITY_HEADERS } from "./responses.js";

/** Bit flags of a line on the wire: [text, flags, time] (time: ms since the epoch to the µs, 0 = none). */
const LINE_STDERR = 1;
const LINE_MARKER = 2;
/** The time is the service's receive time (the agent sent none). */
const LINE_SERVER_TIME = 4;

/** Lines per window request, and the bytes after which a window is cut short. */
const MAX_WINDOW = 2000;
const MAX_WINDOW_BYTES = 4 * 1024 * 1024;
/** Lines a raw download reads a pull, and the bytes of them at most (and one line). */
const RAW_PAGE = 1000;
const RAW_PAGE_BYTES = 1024 * 1024;
/** Lines per Server-Sent Event (a burst is sent in few events). */
const EVENT_LINES = 500;
/** A comment goes out after this long without lines, so proxies and browsers keep the stream. */
const KEEPALIVE_MS = 15_000;

/** Limits of the job endpoints. */
interface JobEndpointLimits {
  /** Event streams open at once; more answer 503. */
  maxStreams: number;
  /** Event streams one console session holds at once; more answer 503 (issue 30 item 8). */
  maxStreamsPerSession: number;
  /** What a job published with its own credentials (issue 26), listed on its page. */
  publications?: (requestId: string) => Promise<Array<{ name: string; version: string }>>;
}

/** The wire form of a stored line: [text, flags], and its time third when it has one. */
function wire(line: StoredLine): WireLine {
  const flags = (line.stderr ? LINE_STDERR : 0) | (line.marker ? LINE_MARKER : 0);
  // A drop marker carries the positions it stands for as a fourth element (its time, 0 when none, third).
  if (line.skipped) return [line.line, flags | (line.serverTime ? LINE_SERVER_TIME : 0), line.time ?? 0, line.skipped];
  return line.time ? [line.line, flags | (line.serverTime ? LINE_SERVER_TIME : 0), line.time] : [line.line, flags];
}

type WireLine = [string, number] | [string, number, number] | [string, number, number, number];

/** The job ID of a path segment, or INVALID_ARGUMENT. */
export function jobId(raw: string): string {
  let decoded: string;
  try {
    decoded = decodeURIComponent(raw);
  } catch {
    decoded = raw;
  }
  const id = normalizeRequestId(decoded);
  if (!id) throw new RunnerDepotError("INVALID_ARGUMENT", "not a job ID");
  return id;
}

/** Builds the job endpoints over a runner service. */
export function createJobEndpoints(runner: RunnerService, limits: JobEndpointLimits) {
  const logs = runner.logs;
  let streams = 0;
  // Streams per session ID (absent: the host's own authorize, no session): bounded by the sessions kept.
  const perSession = new Map<string, number>();

  async function known(id: string) {
    const state = await logs.get(id);
    if (!state) throw new RunnerDepotError("NOT_FOUND", `no job ${id}`);
    return state;
  }

  return {
    /** GET api/jobs?status=&cursor=&limit= */
    async list(url: URL): Promise<Response> {
      const status = url.searchParams.getAll("status").filter((s) => s !== "" && s !== "all") as JobStatus[];
      const cursor = url.searchParams.get("cursor") ?? undefined;
      const limit = intParam(url, "limit", 50, 1, 500);
      return json(
        await runner.listJobs({ status: status.length ? status : undefined, cursor: cursor || undefined, limit }),
      );
    },

    /** GET api/jobs/:id */
    async get(id: string): Promise<Response> {
      const state = await known(id);
      const published = limits.publications
        ? (await limits.publications(state.requestId)).map(({ name, version }) => ({ name, version }))
        : [];
      return json({ ...summarizeJob(state), cancellable: state.status === "open", published });
    },

    /**
     * GET api/jobs/:id/sections — the job's sections (docs/decisions/log-sections.md) with its line count and state,
     * for the viewer to fold. O(sections), at most MAX_SECTIONS.
     */
    async sections(id: string): Promise<Response> {
      const state = await known(id);
      const record = (logs.sections ? await logs.sections(id) : null) ?? emptySections();
      return json({
        ...record,
        storedLines: state.storedLines,
        status: state.status,
        exitCode: state.result?.exitCode ?? null,
        // The viewer hides a cut log's dropped positions behind the marker's row (log-tail.md).
        cut: state.cut ? { at: state.cut.at, lines: state.cut.lines } : null,
      });
    },

    /** GET api/jobs/:id/lines?from=&limit= — a window of stored lines. */
    async lines(id: string, url: URL): Promise<Response> {
      const from = intParam(url, "from", 0, 0, Number.MAX_SAFE_INTEGER);
      const limit = intParam(url, "limit", 500, 1, MAX_WINDOW);
      await known(id);
      const out: WireLine[] = [];
      let bytes = 0;
      for (const line of await logs.read(id, from, limit, { maxBytes: MAX_WINDOW_BYTES })) {
        // Cut short by size: the viewer asks again from where this one ends.
        if (out.length > 0 && bytes + line.line.length > MAX_WINDOW_BYTES) break;
        bytes += line.line.length;
        out.push(wire(line));
      }
      return json({ from, lines: out });
    },

    /**
     * GET api/jobs/:id/events — the log from `Last-Event-ID` (a reconnecting browser sends
     * it) or `?from=` on, then live until the job ends. Each `lines` event's ID is the
     * position after its last line, so a reconnect resumes exactly there.
     */
    async events(id: string, request: Request, url: URL, session?: string): Promise<Response> {
      const header = request.headers.get("last-event-id");
      let from: number;
      if (header !== null && header !== "") {
        if (!/^\d{1,15}$/.test(header))
          throw new RunnerDepotError("INVALID_ARGUMENT", "Last-Event-ID must be a line position");
        from = Number(header);
      } else {
        from = intParam(url, "from", 0, 0, Number.MAX_SAFE_INTEGER);
      }
      await known(id);
      if (streams >= limits.maxStreams) {
        throw new RunnerDepotError("UNAVAILABLE", `${limits.maxStreams} log streams are open; try again later`, {
          details: { retryAfter: 5 },
        });
      }
      const held = session === undefined ? 0 : (perSession.get(session) ?? 0);
      if (held >= limits.maxStreamsPerSession) {
        throw new RunnerDepotError(
          "UNAVAILABLE",
          `this session holds ${limits.maxStreamsPerSession} log streams; close one first`,
          { details: { retryAfter: 5 } },
        );
      }
      streams++;
      if (session !== undefined) perSession.set(session, held + 1);
      const stop = new AbortController();
      const onAbort = () => stop.abort();
      request.signal.addEventListener("abort", onAbort, { once: true });
      const lines = runner.follow(id, { from, signal: stop.signal })[Symbol.asyncIterator]();
      const encoder = new TextEncoder();
      let position = from;
      let pending: Promise<IteratorResult<StoredLine>> | null = null;
      let released = false;
      const release = () => {
        if (released) return;
        released = true;
        streams--;
        if (session !== undefined) {
          const left = (perSession.get(session) ?? 1) - 1;
          if (left > 0) perSession.set(session, left);
          else perSession.delete(session);
        }
        stop.abort();
        request.signal.removeEventListener("abort", onAbort);
        void lines.return?.(undefined);
      };
      const next = () => (pending ??= lines.next());
      const body = new ReadableStream<Uint8Array>({
        start(controller) {
          // Tells EventSource to wait 1 s before reconnecting after a drop.
          controller.enqueue(encoder.encode("retry: 1000\n\n"));
        },
        // Pull-driven: a slow reader holds the stream back instead of filling memory.
        async pull(controller) {
          try {
            const first = await Promise.race([next(), delay(KEEPALIVE_MS, stop.signal)]);
            if (first === null) {
              if (stop.signal.aborted) return;
              controller.enqueue(encoder.encode(": keep-alive\n\n"));
              return;
            }
            pending = null;
            if (first.done) {
              const state = await logs.get(id);
              if (state)
                controller.enqueue(
                  encoder.encode(`event: end\nid: ${position}\ndata: ${JSON.stringify(summarizeJob(state))}\n\n`),
                );
              controller.close();
              release();
              return;
            }
            const batch = [wire(first.value)];
            // A drop marker stands for the positions after it that hold no line any more (log-tail.ts).
            let skipped = first.value.skipped ?? 0;
            // Take whatever else is already there (this store read), up to a batch.
            while (batch.length < EVENT_LINES) {
              const more = await Promise.race([next(), tick()]);
              if (more === null || more.done) break;
              pending = null;
              batch.push(wire(more.value));
              skipped += more.value.skipped ?? 0;
            }
            // The batch's first line is at `position` (a marker read inside the dropped range stands there too).
            const from = position;
            position += batch.length + skipped;
            controller.enqueue(
              encoder.encode(`event: lines\nid: ${position}\ndata: ${JSON.stringify({ from, lines: batch })}\n\n`),
            );
          } catch (error) {
            release();
            controller.error(error);
          }
        },
        cancel() {
          release();
        },
      });
      return new Response(body, {
        headers: {
          ...SECURITY_HEADERS,
          "content-type": "text/event-stream; charset=utf-8",
          "cache-control": "no-store",
          "x-accel-buffering": "no",
        },
      });
    },

    /**
     * GET api/jobs/:id/raw — the stored log as text, streamed page by page; with `?timestamps=1` each line that has
     * a time starts with it in RFC 3339 UTC to the µs and a space (GitLab's form); with `?section=<name>` only that
     * section's lines (the first section of that name, its marker lines included), streamed the same way.
     */
    async raw(id: string, url: URL): Promise<Response> {
      const state = await known(id);
      const range = await sectionLines(logs, id, state.storedLines, url.searchParams.get("section"));
      const stamps = url.searchParams.get("timestamps");
      if (stamps !== null && stamps !== "0" && stamps !== "1")
        throw new RunnerDepotError("INVALID_ARGUMENT", "timestamps must be 0 or 1");
      const withTimes = stamps === "1";
      const encoder = new TextEncoder();
      // A whole log runs to whatever is stored by the time the stream gets there (a live job); a section to its end.
      const to = url.searchParams.has("section") ? range.to : Number.MAX_SAFE_INTEGER;
      const pages = logPages(logs, id, range.from, to, { lines: RAW_PAGE, maxBytes: RAW_PAGE_BYTES });
      const body = new ReadableStream<Uint8Array>({
        async pull(controller) {
          const next = await pages.next();
          if (next.done) {
            controller.close();
            return;
          }
          const page = next.value;
          let text = "";
          if (withTimes)
            for (const line of page) text += line.time ? `${rfc3339Micro(line.time)} ${line.line}\n` : `${line.line}\n`;
          else for (const line of page) text += `${line.line}\n`;
          controller.enqueue(encoder.encode(text));
        },
      });
      return new Response(body, {
        headers: {
          ...SECURITY_HEADERS,
          "content-type": "text/plain; charset=utf-8",
          "content-disposition": `attachment; filename="job-${id}.log"`,
          "cache-control": "no-store",
        },
      });
    },

    /**
     * GET api/jobs/:id/search?q=&regex=1&case=1&from=&limit= — a page of matching lines from `from` on
     * (docs/decisions/log-search.md): bounded by matches, lines and bytes scanned, whatever the log's size.
     */
    async search(id: string, url: URL): Promise<Response> {
      const request = searchRequestOf(url.searchParams);
      return json(await searchJobLog(logs, id, request));
    },

    /** POST api/jobs/:id/cancel */
    async cancel(id: string): Promise<Response> {
      const state = await known(id);
      if (state.status !== "open")
        throw new RunnerDepotError("FAILED_PRECONDITION", `job ${id} has already ended (${state.status})`);
      const result = await runner.cancelJob(id);
      return json({ cancelled: result !== null, result });
    },
  };
}

/** Resolves null after `ms` (or at once when `signal` aborts). */
function delay(ms: number, signal: AbortSignal): Promise<null> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(null);
    const onAbort = () => {
      clearTimeout(timer);
      resolve(null);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve(null);
    }, ms);
    timer.unref?.();
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

/** Resolves null after the current I/O turn: lines already read come first. */
function tick(): Promise<null> {
  return new Promise((resolve) => setImmediate(() => resolve(null)));
}
