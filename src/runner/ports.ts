/**
 * The runner's ports: where job results go (JobResultQueue) and where job logs and
 * job state live (JobLogStore). The service owns the protocol rules; a store only
 * keeps what it is given, item by item, and refuses gaps.
 */

/** How a job ended, as published on the queue. */
export type JobOutcome = "finished" | "lost" | "cancelled";

/** What goes to the queue once per job (docs/runner-protocol.md, §8 "The job result"). */
export interface JobResult {
  /** Lower-case UUID of the job. */
  requestId: string;
  outcome: JobOutcome;
  /** As the runner sent it; -1 for lost and cancelled jobs. */
  exitCode: number;
  /** As the runner sent it; false for lost and cancelled jobs. */
  success: boolean;
  repoUrl: string;
  commitSha: string;
  /** Every line the runner sent, stored or not. */
  lines: { stdout: number; stderr: number };
  /** True when the job-log cap was reached and later lines were not stored. */
  logTruncated: boolean;
  /** ISO-8601 UTC time of the first item, or null when none arrived. */
  startedAt: string | null;
  /** ISO-8601 UTC time the result was made. */
  endedAt: string;
}

/** The queue port: hands a job result to a message queue. */
export interface JobResultQueue {
  /** Resolves once the queue has accepted the result (e.g. a publisher confirm). */
  publishJobResult(result: JobResult): Promise<void>;
  /** Releases connections; calling it twice is harmless. */
  close?(): Promise<void>;
}

/**
 * One stored line of a job's log. What the service hands `append` may be a line the gRPC fast path kept as
 * bytes (`ReceivedLine`: `line` is decoded on first read, and it serialises as this shape);
 * a store that keeps the objects themselves, rather than their fields, pins the request
 * buffer they point into, so keep `line`, `stderr` and `marker` instead.
 */
export interface StoredLine {
  line: string;
  stderr: boolean;
  /** True for lines the service wrote itself (truncation and cap markers). */
  marker?: boolean;
  /**
   * When the line happened, in ms since the Unix epoch kept to the microsecond: the agent's stamp from when it read
   * the line from the job's pipe, else (`serverTime`) when the service received it. Absent (or 0) for lines stored
   * before times existed. docs/runner-protocol.md §2, "Line times".
   */
  time?: number;
  /** True when `time` is the service's receive time: the agent sent no stamp (an older or third-party agent). */
  serverTime?: boolean;
  /**
   * Set by `read` on the drop marker of a job whose log was cut (head, marker, rolling tail): how many positions
   * after the marker's hold no line any more, so the next line returned is at the marker's position + 1 + skipped.
   * Readers that count positions add it (runner/service/log-tail.ts `positionAfter`). docs/decisions/log-tail.md.
   */
  skipped?: number;
}

/**
 * What one runner item leaves in the store. Offsets count runner items, so an item always advances the count by
 * one, whatever it stores: its line (possibly cut), a marker after it, or nothing at all once the job's log is
 * capped. A store may serialise or clone its entries.
 * Why: docs/decisions/runner-server.md, "ports.ts: LogEntry".
 */
export interface LogEntry {
  /** Lines to store for this item, in order (0 to 3). */
  stored: StoredLine[];
  /** Which stream the runner's line came from (counted in the result's `lines`). */
  stderr: boolean;
  /**
   * What the item counts toward the job's log cap: each line it stores (a line-truncated marker included)
   * costs a fixed overhead plus its bytes as the costliest store writes them (runner/service/log-cap.ts).
   */
  bytes: number;
  /** True when this item is where the job's log reached its cap. */
  capped?: boolean;
  /**
   * Set on the item whose lines would pass the head's share of the cap (when the service keeps a tail): the store
   * puts the drop marker at the next position, then keeps this item and every later one in a rolling tail whose
   * entries count at most `tailBytes` (runner/service/log-tail.ts). docs/decisions/log-tail.md.
   */
  tailBytes?: number;
}

/** One segment of a cut log's rolling tail: positions `[first, first + lines)`, counting `bytes` toward the cap. */
export interface TailSegment {
  first: number;
  lines: number;
  bytes: number;
}

/**
 * Where a job's log was cut (docs/decisions/log-tail.md): the head is positions `[0, at)`, the drop marker is
 * position `at`, positions `at + 1 … at + lines` were dropped, and the tail's segments follow, oldest first.
 */
export interface LogCut {
  /** Position of the drop marker (the head's line count). */
  at: number;
  /** Lines dropped, counted. */
  lines: number;
  /** What the dropped lines counted toward the cap. */
  bytes: number;
  /** Most bytes the tail keeps (the entries' `bytes`). */
  tailBytes: number;
  /** The marker's time (the item that started the tail), ms; 0 = none. */
  time: number;
  /** The tail's segments, oldest first; contiguous, the first at `at + 1 + lines`. */
  segments: TailSegment[];
}

/** Job state as a store keeps it. */
export type JobStatus = "open" | "finished" | "cancelled" | "lost";

/** What the host told the service about a job it launched. */
export interface JobInfo {
  repoUrl?: string;
  commitSha?: string;
  [key: string]: unknown;
}

/** A job's state. */
export interface JobState {
  requestId: string;
  status: JobStatus;
  /** Runner items durably stored (`runner-committed`); the `end` item counts. */
  committed: number;
  /** Lines stored so far, markers included (positions for `read`). */
  storedLines: number;
  /**
   * What the stored lines count toward the job's log cap (the sum of the entries' `bytes`): an upper
   * bound of the bytes any of this package's stores writes for them, the cap marker excluded.
   */
  storedBytes: number;
  lines: { stdout: number; stderr: number };
  logTruncated: boolean;
  /** True when registered by the host through `expectJob`. */
  expected: boolean;
  info: JobInfo;
  /**
   * ISO-8601 of when the store first heard of the job (registration or first item): the
   * key job lists are ordered by. Absent in states written before it existed.
   */
  createdAt?: string;
  /** ISO-8601 of the first item, or null. */
  startedAt: string | null;
  /** ISO-8601 of the last item or registration: lost detection counts from here. */
  lastSeenAt: string;
  /** The result once the job ended in any way. */
  result: JobResult | null;
  /** Set once the job's lines moved to a log archive (they are no longer in the store). */
  archived?: ArchivedLog;
  /** Set once the log passed the head's share and a tail is kept (positions: docs/decisions/log-tail.md). */
  cut?: LogCut;
}

/** Where an ended job's log went: one object in a {@link LogArchiveStore}, keyed by the job's ID. */
export interface ArchivedLog {
  /** Lines in the object: the job's `storedLines`, less the dropped ones of a cut log. */
  lines: number;
  /** Bytes of the object (compressed chunks, index and trailer). */
  bytes: number;
  /** Compressed chunks in the object: the index and trailer are its last `chunks × 8 + 32` bytes. */
  chunks: number;
  /** Bytes of the lines' records before compression. */
  rawBytes: number;
  /** ISO-8601 of when the object was written. */
  at: string;
  /** The job's cut when its log was cut: the object holds head, marker and tail, back to back. */
  cut?: LogCut;
}

/**
 * Objects in a blob store (S3, a directory) that hold archived job logs. Objects are
 * small in number and written once; reads are ranged, so a tail costs what it reads.
 */
export interface LogArchiveStore {
  /** Stores the object under `key` whole, or not at all when `body` throws; replaces an older one. */
  put(key: string, body: AsyncIterable<Uint8Array>): Promise<void>;
  /** Bytes `[start, end)` of the object, or null when there is no such object. */
  read(key: string, start: number, end: number): Promise<Uint8Array | null>;
  /** Removes the object; absent is fine. */
  delete(key: string): Promise<void>;
  /** Removes objects written before `before` (retention); returns how many. O(objects held). */
  prune?(before: Date): Promise<number>;
  /** Releases resources; calling it twice is harmless. */
  close?(): Promise<void>;
}

/**
 * Stored lines as the store keeps their bytes, for moving them without decoding (the
 * archive): `each` visits line k as `bytes[start, end)` (UTF-8) with its flags (bit 0
 * stderr, bit 1 marker, bit 2 server time) and its time (ms to the µs, 0 = none), in order.
 */
export interface RawLinePage {
  /** Lines in the page. */
  readonly count: number;
  /** Visits every line of the page in order. O(lines); no copy, no string. */
  each(visit: (bytes: Buffer, start: number, end: number, flags: number, time: number) => void): void;
}

/**
 * One section of a job's log (docs/decisions/log-sections.md): a GitLab `section_start` … `section_end` or a GitHub
 * `::group::` … `::endgroup::`, as the service read it from the stored (masked) lines.
 */
export interface LogSection {
  /** GitLab's section name or GitHub's group title, at most 256 UTF-8 bytes. */
  name: string;
  format: "gitlab" | "github";
  /** Position of the start marker's line (as `read` numbers lines, from 0). */
  start: number;
  /** Position of the end marker's line; null while the section is open (still open when the job ended). */
  end: number | null;
  /** Sections it is nested in (0 = top level). */
  depth: number;
  /** When it started, ms since the epoch: GitLab's marker time, else the line's time; 0 when unknown. */
  startTime: number;
  /** When it ended, likewise; null while open. */
  endTime: number | null;
  /** GitLab's `[collapsed=true]`, and every GitHub group: shown folded. */
  collapsed: boolean;
}

/** A job's sections, bounded (log-sections.ts): what `JobLogStore.sections` keeps per job. */
export interface LogSections {
  /** In start order; at most MAX_SECTIONS. */
  sections: LogSection[];
  /** Starts not kept: past MAX_SECTIONS, or nested deeper than MAX_SECTION_DEPTH. */
  dropped: number;
  /** Ends that matched no open section (ignored). */
  unmatched: number;
}

/** What `follow(id, { sections: true })` yields besides lines: a section started or ended at line `position`. */
export interface LogSectionEvent {
  section: "start" | "end";
  name: string;
  format: "gitlab" | "github";
  /** The marker line's position; the event comes right after that line. */
  position: number;
  depth: number;
  /** ms since the epoch, 0 when unknown. */
  time: number;
}

/** What `JobLogStore.findLines` answers: candidate lines with their positions, and where the scan stopped. */
export interface FoundLines {
  hits: Array<{ position: number; line: StoredLine }>;
  /** The position after the last line scanned. */
  next: number;
  /** Stored bytes scanned. */
  bytes: number;
}

/** What a store's `watch` reports: a job stored lines or ended (null: events may have been missed, look again). */
export type JobLogEvent = { requestId: string; storedLines: number; ended: boolean } | null;

/** What `JobLogStore.list` is asked for. */
export interface JobListQuery {
  /** Only jobs in these states; undefined for all. */
  status?: readonly JobStatus[];
  /** Most states to return. */
  limit: number;
  /** Only jobs ordered after this key (exclusive), i.e. older ones. */
  before?: { createdAt: string; requestId: string };
}

/**
 * How much one `JobLogStore.read` may return. With `maxBytes` the page ends before the first line that would take the
 * text of its lines past that many bytes, except its first line, which is always returned (a reader moves on whatever
 * one line's size). Each store counts a line as it holds it (its UTF-8 bytes, or the characters of its record), and
 * may end a page sooner (the PostgreSQL store at a row of lines), so the bound is on the memory a page holds, not an
 * exact byte count. A bound below 1 is 1 and a fraction is rounded down; one that is not a finite number is none.
 * Callers that page through a log with it stop at an empty page, not a short one.
 */
export interface LogReadOptions {
  maxBytes?: number;
}

/**
 * The log-store port. Every method is safe to call concurrently for different jobs;
 * for one job the service serialises its own calls, but several service replicas may
 * share a store, so `append` and `finish` must be atomic in the backend.
 */
export interface JobLogStore {
  /**
   * Returns the job's state, creating an open job when it does not exist.
   * `expect` marks it as registered by the host and merges `info`.
   */
  open(requestId: string, options?: { expect?: boolean; info?: JobInfo; now?: Date }): Promise<JobState>;
  /** The job's state, or null when the store has never heard of it. */
  get(requestId: string): Promise<JobState | null>;
  /**
   * Appends entries, the first of which is item `at` of the job.
   * Entries below `committed` are skipped (idempotent overlap, not compared);
   * `at > committed` throws RunnerDepotError FAILED_PRECONDITION and stores nothing;
   * a job that is not open throws FAILED_PRECONDITION and stores nothing.
   * Returns the state after the append.
   */
  append(requestId: string, at: number, entries: LogEntry[], now?: Date): Promise<JobState>;
  /**
   * Ends the job once. With `at` the end is runner item `at` and counts in
   * `committed` (it must equal `committed`, else FAILED_PRECONDITION). The first
   * finish wins: a later one changes nothing and returns `first: false` with the
   * state holding the first result.
   */
  finish(requestId: string, result: JobResult, options?: { at?: number }): Promise<{ state: JobState; first: boolean }>;
  /**
   * Stored lines from position `from` (0-based, markers included), at most `limit`, and with `options.maxBytes` at
   * most about that many bytes of line text ({@link LogReadOptions}): a page shorter than `limit` is not the log's end.
   */
  read(requestId: string, from?: number, limit?: number, options?: LogReadOptions): Promise<StoredLine[]>;
  /**
   * The same lines as `read`, as stored bytes (optional): the archive moves them into its
   * records without a string per line. Stores that keep strings need not have it.
   */
  readRaw?(requestId: string, from: number, limit: number, options?: LogReadOptions): Promise<RawLinePage>;
  /**
   * Optional: the job's sections as folded from its stored lines at append time (runner/service/log-sections.ts's
   * `foldSections`, inside the same atomic append), kept when the lines move to an archive; null for an unknown job.
   * A store without it has no sections (the API answers an empty list). O(sections), bounded per job.
   */
  sections?(requestId: string): Promise<LogSections | null>;
  /**
   * Optional fast path of a literal search (runner/service/log-search.ts): scans the job's stored lines from
   * position `from` and returns, with their positions, the lines that may contain `needle` (a superset: the caller
   * checks each; with `options.ignoreCase` upper and lower case match each other, as a JS RegExp's `i` flag has
   * them), at most `options.maxHits` of them, after scanning about `options.maxBytes` of stored bytes at most
   * (whole records: one record may pass it). `next` is the position after the last line scanned, `bytes` what was
   * scanned. Null when the store cannot (the job's lines are not here, archived or unknown; or it cannot search
   * that needle so): the caller reads the lines with `read`. Its cost should follow `maxBytes`, not the lines
   * before `from`.
   */
  findLines?(
    requestId: string,
    needle: string,
    from: number,
    options: { maxBytes: number; maxHits: number; ignoreCase?: boolean },
  ): Promise<FoundLines | null>;
  /** Open jobs whose `lastSeenAt` is before `before` (lost-job detection). */
  stale(before: Date): Promise<JobState[]>;
  /**
   * Jobs newest first by (createdAt, requestId) descending — createdAt falling back to
   * startedAt, then lastSeenAt, for states without it — filtered by status, strictly
   * after `before`, at most `limit`. Optional: without it `listJobs` answers FAILED_PRECONDITION.
   * Its cost should follow `limit` (an index), not the number of jobs held.
   */
  list?(query: JobListQuery): Promise<JobState[]>;
  /**
   * Optional: ended jobs not yet archived whose result is older than `endedBefore`, oldest
   * first, at most `limit` (the archive sweep). Its cost should follow `limit`.
   */
  archivable?(endedBefore: Date, limit: number): Promise<JobState[]>;
  /**
   * Optional: records that an ended job's lines now live in an archive and drops them from
   * the store, atomically. `archived.lines` must equal the job's kept lines (`storedLines` less a cut's dropped ones), else
   * FAILED_PRECONDITION; an open job is FAILED_PRECONDITION; an already archived job is
   * left as it is (the first archive wins). Returns the state, or null for an unknown job.
   */
  markArchived?(requestId: string, archived: ArchivedLog): Promise<JobState | null>;
  /**
   * Optional: calls `listener` when any replica sharing the store stored lines of a job or
   * ended one (at least once per change, possibly coalesced), and with null when events may
   * have been missed (a reconnect). Returns the unsubscribe function. Without it the service
   * only hears of its own appends and polls for the rest.
   */
  watch?(listener: (event: JobLogEvent) => void): () => void;
  /** Forgets ended jobs whose result is older than `before` (retention). Returns how many. */
  prune?(before: Date): Promise<number>;
  /** Releases resources; calling it twice is harmless. */
  close?(): Promise<void>;
}
