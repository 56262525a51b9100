/**
 * Fan-out of a job's new lines to every follower of it in this process (1,000 followers on 100 jobs is 100
 * tails, not 1,000 readers). Per followed job one {@link JobTail} keeps the most recent lines in a bounded
 * ring: lines this replica stored go in without a read; lines another replica stored (heard through the
 * store's `watch`, e.g. PostgreSQL LISTEN/NOTIFY, or found by the tail's poll) are read once per replica and
 * shared.
 * Why: docs/decisions/log-archive.md, "fanout.ts: one tail per followed job".
 */
import { positionAfter } from "./log-tail.js";
import type { JobLogEvent, JobLogStore, JobState, LogEntry, StoredLine } from "../ports.js";
import { stripUndefined } from "./strip-undefined.js";
import { pushPlain, storedCount } from "../protocol/received-line.js";

/** Bounds of the fan-out (RunnerServiceOptions.follow). */
export interface FollowOptions {
  /**
   * Most lines kept per followed job for followers at the live end (lines every follower has passed are dropped
   * sooner); default 4 096.
   */
  bufferLines: number;
  /** UTF-16 code units (about bytes) kept per followed job; default 1 MiB. */
  bufferBytes: number;
  /**
   * How often a followed job's state is read when nothing was heard: the bound on how late a
   * line stored by another replica reaches a follower when no event arrives. Default 1 000
   * without a store `watch`, 5 000 with one (events are the normal path then).
   */
  pollMs: number;
  /**
   * Events of the store's `watch` wake a followed job's followers at most once per this many ms; events
   * meanwhile are merged and applied when the interval ends (the first one after a quiet interval is applied at
   * once). Default 100; it is also the most an event is delayed while events keep coming.
   * Why: docs/decisions/log-archive.md, "fanout.ts: FollowOptions.eventIntervalMs".
   */
  eventIntervalMs: number;
}

/** The default bounds; `pollMs` here is the one without a store `watch`. */
const DEFAULT_FOLLOW_OPTIONS: Readonly<FollowOptions> = Object.freeze({
  bufferLines: 4096,
  bufferBytes: 1024 * 1024,
  pollMs: 1000,
  eventIntervalMs: 100,
});

/** Rough retained size of a line in the ring (string + object). */
const lineCost = (line: StoredLine) => line.line.length + 48;

/** Where one follower of a job is: the position of the next line it will yield. */
interface FollowCursor {
  position: number;
}

/** One followed job: its ring of recent lines and what is known of it. */
export class JobTail {
  /** Wakers of the followers waiting at the live end. */
  readonly waiting = new Set<() => void>();
  /** Followers attached. */
  followers = 0;
  /**
   * The followers' positions.
   * Why: docs/decisions/log-archive.md, "fanout.ts: JobTail.cursors".
   */
  private readonly cursors = new Set<FollowCursor>();
  /** The ring: `lines[i]` is line `start + i` (`head` lines at the front are dropped ones). */
  private lines: StoredLine[] = [];
  private head = 0;
  private bytes = 0;
  /** Position of the ring's first line; -1 until the first fill or push sets it. */
  start = -1;
  /** Highest stored-line count heard of (events, this replica's appends, the poll). */
  known = 0;
  /** Last state read, null when the store did not know the job. */
  state: JobState | null = null;
  /** True once the job was ever seen in the store. */
  seen = false;
  /** True when an event says the state changed (an end) and it should be read again. */
  stale = true;
  /** True when a read found nothing where lines should be (an archive that is gone): nothing more will come. */
  exhausted = false;
  reading: Promise<void> | null = null;
  refreshing: Promise<void> | null = null;
  timer: NodeJS.Timeout | null = null;
  /** Events heard but not yet applied (the event interval was still running). */
  heardLines = 0;
  heardEnded = false;
  /** When events were last applied (performance.now()), and the timer applying the held ones. */
  eventsAt = Number.NEGATIVE_INFINITY;
  eventTimer: NodeJS.Timeout | null = null;

  constructor(readonly id: string) {}

  /** Position after the ring's last line. */
  get end(): number {
    return this.start < 0 ? -1 : this.start + this.lines.length - this.head;
  }

  /** Up to `max` ring lines from `position` (which must be in the ring). O(max). */
  slice(position: number, max: number): StoredLine[] {
    const from = this.head + (position - this.start);
    return this.lines.slice(from, Math.min(this.lines.length, from + max));
  }

  /**
   * Appends lines at the ring's end and drops the oldest past the bounds, and those every
   * follower has passed (amortised O(1) a line, plus O(followers of the job)).
   */
  push(lines: readonly StoredLine[], options: FollowOptions): void {
    for (const line of lines) {
      // Shared by every follower of the job: frozen, so none can change another's.
      this.lines.push(Object.freeze(line));
      this.bytes += lineCost(line);
    }
    while (
      this.lines.length - this.head > options.bufferLines ||
      (this.bytes > options.bufferBytes && this.lines.length - this.head > 1)
    )
      this.dropFirst();
    this.trim();
  }

  /** Counts a follower at `cursor.position` in (it must leave when it stops). */
  join(cursor: FollowCursor): void {
    this.cursors.add(cursor);
  }

  leave(cursor: FollowCursor): void {
    this.cursors.delete(cursor);
  }

  /**
   * Drops the ring lines every follower has passed (call after a cursor moved on). O(followers of the job) plus the
   * lines dropped.
   */
  trim(): void {
    if (this.start < 0 || this.cursors.size === 0) return;
    let min = Number.POSITIVE_INFINITY;
    for (const cursor of this.cursors) if (cursor.position < min) min = cursor.position;
    const upTo = Math.min(min, this.end);
    while (this.start < upTo) this.dropFirst();
    if (this.head === this.lines.length) {
      this.lines = [];
      this.head = 0;
    } else if (this.head > 1024 && this.head > this.lines.length / 2) {
      // Compact once the dropped front outweighs the kept lines.
      this.lines = this.lines.slice(this.head);
      this.head = 0;
    }
  }

  private dropFirst(): void {
    this.bytes -= lineCost(this.lines[this.head]!);
    // Unreferenced at once, not at the next compaction.
    this.lines[this.head] = undefined as unknown as StoredLine;
    this.head++;
    this.start++;
  }

  /** Starts the ring at `position` (empty). */
  reset(position: number): void {
    this.lines = [];
    this.head = 0;
    this.bytes = 0;
    this.start = position;
  }

  wake(): void {
    const wakers = [...this.waiting];
    this.waiting.clear();
    for (const wake of wakers) wake();
  }
}

/** Lines read per store call (a fill or a follower's catch-up). */
export const FOLLOW_PAGE = 1024;

/** Bytes one follower's read, or one fill of the shared ring, may bring (`JobLogStore.read`'s `maxBytes`). */
export const FOLLOW_PAGE_BYTES = 512 * 1024;

/**
 * The process's tails. `stored` is called after this replica appended (lines in hand),
 * `changed` after it ended a job; the store's `watch` reports the other replicas.
 *
 * @example
 * const fanout = new LogFanout(logs, { bufferLines: 4096, bufferBytes: 1 << 20, pollMs: 1000 }, console.error);
 * const tail = fanout.attach(requestId);
 * // … see followJob (runner/service/follow.ts) …
 * fanout.detach(tail);
 */
export class LogFanout {
  private readonly tails = new Map<string, JobTail>();
  private unwatch: (() => void) | null = null;
  private closed = false;
  readonly options: FollowOptions;

  constructor(
    private readonly logs: JobLogStore,
    options: Partial<FollowOptions>,
    private readonly report: (error: unknown) => void,
  ) {
    const pollMs = options.pollMs ?? (logs.watch ? 5000 : DEFAULT_FOLLOW_OPTIONS.pollMs);
    this.options = { ...DEFAULT_FOLLOW_OPTIONS, ...stripUndefined(options), pollMs };
  }

  /** The tail of job `id`, made on its first follower. O(1). */
  attach(id: string): JobTail {
    let tail = this.tails.get(id);
    if (!tail) {
      tail = new JobTail(id);
      this.tails.set(id, tail);
      // One subscription per process, whatever the number of followers.
      if (!this.unwatch && this.logs.watch && !this.closed)
        this.unwatch = this.logs.watch((event) => this.onEvent(event));
      const t = tail;
      t.timer = setInterval(() => {
        t.stale = true;
        void this.refresh(t).then(() => t.wake(), this.report);
      }, this.options.pollMs);
      t.timer.unref?.();
    }
    tail.followers++;
    return tail;
  }

  /** Lets go of a tail; the last follower's leaving drops it. */
  detach(tail: JobTail): void {
    if (--tail.followers > 0) return;
    if (tail.timer) clearInterval(tail.timer);
    if (tail.eventTimer) clearTimeout(tail.eventTimer);
    tail.wake();
    if (this.tails.get(tail.id) === tail) this.tails.delete(tail.id);
  }

  /** This replica stored `batch` of job `id`; `state` is the store's answer. No store read. */
  stored(id: string, state: JobState, batch: readonly LogEntry[]): void {
    const tail = this.tails.get(id);
    if (!tail) return;
    let count = 0;
    for (const entry of batch) count += storedCount(entry);
    const first = state.storedLines - count;
    if (tail.start >= 0 && first === tail.end && count > 0) {
      const lines: StoredLine[] = [];
      // Plain copies (a received line is a view of the request's buffer: the ring must not keep it).
      for (const entry of batch) pushPlain(lines, entry);
      tail.push(lines, this.options);
    }
    tail.state = state;
    tail.seen = true;
    tail.known = Math.max(tail.known, state.storedLines);
    tail.wake();
  }

  /** This replica changed job `id` otherwise (its end was recorded): read its state again. */
  changed(id: string): void {
    const tail = this.tails.get(id);
    if (!tail) return;
    tail.stale = true;
    tail.wake();
  }

  private onEvent(event: JobLogEvent): void {
    if (event === null) {
      // Events may have been missed: every tail reads its state again.
      for (const tail of this.tails.values()) this.changed(tail.id);
      return;
    }
    const tail = this.tails.get(event.requestId);
    if (!tail) return;
    // Held, not applied: a storm of events (forged NOTIFYs among them) must not turn into a
    // store read each. O(1) per event; one timer per followed job at most.
    tail.heardLines = Math.max(tail.heardLines, event.storedLines);
    tail.heardEnded ||= event.ended;
    if (tail.eventTimer) return;
    const wait = tail.eventsAt + this.options.eventIntervalMs - performance.now();
    if (wait <= 0) return this.applyEvents(tail);
    tail.eventTimer = setTimeout(() => {
      tail.eventTimer = null;
      this.applyEvents(tail);
    }, wait);
    tail.eventTimer.unref?.();
  }

  /** Applies the held events of a tail: one wake, so one fill (and at most one state read). */
  private applyEvents(tail: JobTail): void {
    tail.eventsAt = performance.now();
    if (tail.heardLines > tail.known) tail.known = tail.heardLines;
    if (tail.heardEnded) tail.stale = true;
    tail.heardLines = 0;
    tail.heardEnded = false;
    tail.wake();
  }

  /**
   * Reads the job's state once for every follower waiting on it (single flight); again
   * when an event marked it stale while the read was in flight, so no change is missed.
   */
  refresh(tail: JobTail): Promise<void> {
    if (!tail.stale) return tail.refreshing ?? Promise.resolve();
    tail.refreshing ??= (async () => {
      try {
        while (tail.stale) {
          tail.stale = false;
          const state = await this.logs.get(tail.id);
          tail.state = state;
          if (state) {
            tail.seen = true;
            tail.known = Math.max(tail.known, state.storedLines);
          }
        }
      } catch (error) {
        tail.stale = true;
        throw error;
      } finally {
        tail.refreshing = null;
      }
    })();
    return tail.refreshing;
  }

  /**
   * Reads the next known lines into the ring for the followers at its end (single flight):
   * one store read per replica, whatever the number of followers. O(FOLLOW_PAGE).
   */
  fill(tail: JobTail, position: number): Promise<void> {
    tail.reading ??= (async () => {
      try {
        if (tail.start < 0) tail.reset(position);
        const from = tail.end;
        const want = Math.min(FOLLOW_PAGE, tail.known - from);
        if (want <= 0) return;
        const lines = await this.logs.read(tail.id, from, want, { maxBytes: FOLLOW_PAGE_BYTES });
        if (tail.end !== from) return;
        // The ring holds contiguous positions: a page that meets a cut log's dropped range restarts it past there,
        // and the followers behind read the marker themselves (follow.ts). O(page).
        if (lines.some((l) => l.skipped)) tail.reset(positionAfter(from, lines));
        else if (lines.length > 0) tail.push(lines, this.options);
        else {
          // Nothing where the count says lines are: an ended job's are gone (an archive
          // removed); an open job's hint was early. Followers wait for the next event or poll.
          tail.stale = true;
          await this.refresh(tail);
          if (tail.state && tail.state.status !== "open" && tail.state.storedLines > from) tail.exhausted = true;
          tail.known = from;
        }
      } finally {
        tail.reading = null;
      }
    })();
    return tail.reading;
  }

  /** Stops the subscription and every tail's poll. */
  close(): void {
    this.closed = true;
    this.unwatch?.();
    this.unwatch = null;
    for (const tail of this.tails.values()) {
      if (tail.timer) clearInterval(tail.timer);
      if (tail.eventTimer) clearTimeout(tail.eventTimer);
      tail.wake();
    }
  }
}
